"""saveTrace: write the recorded run to a trace file, to debug it later without the device
(launch with `trace`, or the language server's `trace` option). See docs/trace-format.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dap_server.requests import StrictArguments, request

if TYPE_CHECKING:
    from dap_server.adapter import Adapter


class SaveTraceArguments(StrictArguments):
    path: str


@request("saveTrace")
def save_trace(adapter: "Adapter", args: SaveTraceArguments) -> dict:
    adapter.require_launched()
    with adapter.events.progress(f"Saving the trace to {args.path}", cancellable=False):
        return adapter.session.save_trace(args.path)
