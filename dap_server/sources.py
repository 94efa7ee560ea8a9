"""source and loadedSources: the user files the Program's nodes come from."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from dap_server.frames import source as source_of
from dap_server.requests import Arguments, capability, request
from hardware.errors import RewindError, echo

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it


class SourceRef(Arguments):
    name: str | None = None
    path: str | None = None
    sourceReference: int | None = None


def source_path(ref: SourceRef) -> str:
    """The absolute path a client's Source names (the Program knows its files by resolved path)."""
    if not ref.path:
        raise RewindError("a source must be given by 'path' (Rewind's sources are files on disk)")
    if "\0" in ref.path:
        raise RewindError(f"source path '{echo(ref.path)}' contains a NUL character: it names no file")
    path = _from_uri(ref.path) if ref.path.startswith("file:") else ref.path
    try:
        return str(Path(path).resolve())
    except (OSError, ValueError, RuntimeError) as exc:  # too long, a symlink loop, ...
        reason = getattr(exc, "strerror", None) or "it cannot be resolved"
        raise RewindError(f"source path '{echo(ref.path)}' names no file: {reason.lower()}") from None


def _from_uri(uri: str) -> str:
    """The path a file URI names (nvim-dap sends `file:///home/me/model.py` where DAP has a path)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise RewindError(f"source '{echo(uri)}' is a file on the machine '{echo(parts.netloc)}': Rewind reads the "
                          "files of the machine it runs on (give a path, or a file:/// URI)")
    return urllib.parse.unquote(parts.path)


class SourceArguments(Arguments):
    source: SourceRef | None = None
    sourceReference: int = 0


@request("source")
def source(adapter: "RequestContext", args: SourceArguments) -> dict:
    adapter.require_launched()
    files = adapter.session.program.source_files
    path = args.source.path if args.source and args.source.path else None
    text = files.get(source_path(args.source)) if path else None
    if text is None:
        known = ", ".join(Path(f).name for f in files) or "none"
        raise RewindError(f"no source for {echo(path) if path else f'reference {args.sourceReference}'} "
                          f"(program files: {known})")
    return {"content": text, "mimeType": "text/x-python"}


class LoadedSourcesArguments(Arguments):
    pass


@request("loadedSources")
@capability("supportsLoadedSourcesRequest")
def loaded_sources(adapter: "RequestContext", args: LoadedSourcesArguments) -> dict:
    adapter.require_launched()
    return {"sources": [source_of(path) for path in sorted(adapter.session.program.source_files)]}
