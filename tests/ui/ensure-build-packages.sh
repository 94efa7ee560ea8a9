#!/bin/sh
# code-server's postinstall compiles native modules (kerberos needs the GSSAPI headers of Debian's libkrb5-dev;
# the others g++ and make). Installs what is missing. Idempotent; installing needs root (as in CI), otherwise it
# says what to run and fails.
set -eu
missing=""
[ -f /usr/include/gssapi/gssapi.h ] || missing="$missing libkrb5-dev"
command -v g++ >/dev/null || missing="$missing g++"
command -v make >/dev/null || missing="$missing make"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "ensure-build-packages: code-server's native modules need$missing; as root: apt-get install -y$missing" >&2
    exit 1
fi
echo "ensure-build-packages: installing$missing (apt-get)" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
