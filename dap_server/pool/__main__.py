"""`python -m dap_server.pool [--socket PATH]`: run the engine pool in the foreground (`rewind pool` does the same)."""

from __future__ import annotations

import argparse
import sys

from dap_server.pool import POOL_VARIABLE
from dap_server.pool.forks import default_socket, run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", metavar="PATH", help="where it listens (default: $XDG_RUNTIME_DIR/rewind/"
                        "engines.sock, else a private folder in the temporary folder)")
    parser.add_argument("--verbose", action="store_true", help="say on stderr when an engine is forked and when it "
                        "ends")
    parser.add_argument("--ready-fd", type=int, metavar="FD", help=argparse.SUPPRESS)  # closed once it listens


DESCRIPTION = ("Fork the engine of each debug session from one process that has imported torch and Rewind already: "
               f"a DAP server, `rewind debug` included, started with {POOL_VARIABLE} set to the socket asks it for its "
               "engines, and a session starts in a fraction of a second. Stop it with Ctrl-C (it ends when its "
               "engines have); docs/engine-pool.md.")


def run_pool(args: argparse.Namespace) -> int:
    run(args.socket or default_socket(), args.ready_fd, args.verbose)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewind pool", description=DESCRIPTION)
    add_arguments(parser)
    return run_pool(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
