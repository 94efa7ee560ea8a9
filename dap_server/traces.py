"""saveTrace: write the recorded run to a trace file, to debug it later without the device
(launch with `trace`, or the language server's `trace` option). See docs/trace-format.md.

The file appears whole or not at all; an existing file is replaced only with `overwrite: true`, and
never a link, a folder, a FIFO or device, nor the trace the session has open (checkpoint/safe_files.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from checkpoint.safe_files import TargetExists
from dap_server.paths import in_session
from dap_server.requests import StrictArguments, request
from hardware.errors import RewindError

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it


class SaveTraceArguments(StrictArguments):
    path: str  # a relative path is taken from the session's working directory (launch's `cwd`)
    overwrite: bool = False  # replace an existing file at `path`


def exists_message(command: str, path: str) -> str:
    return f"{command}: {path} exists; send overwrite: true to replace it"


@request("saveTrace")
def save_trace(adapter: "RequestContext", args: SaveTraceArguments) -> dict:
    adapter.require_launched()
    path = in_session(adapter, args.path)
    try:
        with adapter.events.progress(f"Saving the trace to {path}", cancellable=False):
            return adapter.session.save_trace(path, overwrite=args.overwrite)
    except TargetExists as exc:  # with ranks, the file that exists may be a rank's beside `path`
        raise RewindError(exists_message("saveTrace", exc.path or path)) from None
    except RewindError as exc:
        raise RewindError(f"saveTrace: {exc}") from None
