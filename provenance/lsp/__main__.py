"""`python -m provenance.lsp` serves over stdio; `--tcp [--host H] --port N` listens on a socket."""

from __future__ import annotations

import argparse
import logging

from provenance.lsp.server import server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m provenance.lsp", description="Rewind language server")
    parser.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (the default)")
    parser.add_argument("--tcp", action="store_true", help="listen on a TCP socket instead")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=2087)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    if args.stdio and args.tcp:
        parser.error("choose one of --stdio and --tcp")
    logging.basicConfig(level=args.log_level.upper())
    if args.tcp:
        server.start_tcp(args.host, args.port)
    else:
        server.start_io()


if __name__ == "__main__":
    main()
