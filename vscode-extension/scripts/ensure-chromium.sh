#!/bin/sh
# The webview test renders the Tensor view in Debian's chromium; install it when it is missing.
# Idempotent. Installing needs root (as in CI); otherwise it says what to run and fails.
set -eu
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "ensure-chromium: $CHROMIUM is missing; install it as root: apt-get install -y chromium" >&2
    exit 1
fi
echo "ensure-chromium: installing chromium (apt-get)" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
test -x "$CHROMIUM" || { echo "ensure-chromium: apt-get did not install $CHROMIUM" >&2; exit 1; }
