"""source and loadedSources: the user files the Program's nodes come from."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dap_server.frames import source as source_of
from dap_server.requests import Arguments, capability, request
from hardware.errors import RewindError

if TYPE_CHECKING:
    from dap_server.adapter import Adapter


class SourceRef(Arguments):
    name: str | None = None
    path: str | None = None
    sourceReference: int | None = None


def source_path(ref: SourceRef) -> str:
    """The absolute path a client's Source names (the Program knows its files by resolved path)."""
    if not ref.path:
        raise RewindError("a source must be given by 'path' (Rewind's sources are files on disk)")
    return str(Path(ref.path).resolve())


class SourceArguments(Arguments):
    source: SourceRef | None = None
    sourceReference: int = 0


@request("source")
def source(adapter: "Adapter", args: SourceArguments) -> dict:
    adapter.require_launched()
    files = adapter.session.program.source_files
    path = args.source.path if args.source and args.source.path else None
    text = files.get(source_path(args.source)) if path else None
    if text is None:
        known = ", ".join(Path(f).name for f in files) or "none"
        raise RewindError(f"no source for {path or f'reference {args.sourceReference}'} (program files: {known})")
    return {"content": text, "mimeType": "text/x-python"}


class LoadedSourcesArguments(Arguments):
    pass


@request("loadedSources")
@capability("supportsLoadedSourcesRequest")
def loaded_sources(adapter: "Adapter", args: LoadedSourcesArguments) -> dict:
    adapter.require_launched()
    return {"sources": [source_of(path) for path in sorted(adapter.session.program.source_files)]}
