"""The language server: pygls features over one Analysis.

Give the run in `initializationOptions` ({"program" or "trace", "entry", "driver", "reference",
"budgetMB", "seed", "schedule", "faults"}) or run the `rewind.analyse` command with the same object; saving one of the program's
files runs it again. `rewind.goto` (a tick) moves the position hovers describe, so an editor can follow the
debugger. Diagnostics are published for every source file of the program.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from hardware.errors import RewindError
from provenance.lsp.analysis import Analysis, AnalysisOptions, Result
from provenance.lsp.render import diagnostics_by_file, hover_markdown

NAME, VERSION = "rewind-lsp", "0.1.0"


class RewindLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(NAME, VERSION)
        self.analysis = Analysis()
        self.initialization_options: Any = None
        self.options: AnalysisOptions | None = None
        self.published: set[str] = set()  # files we published diagnostics for

    async def analyse(self, options: AnalysisOptions) -> Result:
        self.options = options
        result = await self.analysis.call(self.analysis.analyse, options)
        sources = self.analysis.session.program.source_files
        by_file = diagnostics_by_file(result.problems, sources)
        files = self.published | set(result.files) | set(by_file)
        for file in sorted(files):  # an empty list clears what an earlier run published
            self.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(uri=from_fs_path(file), diagnostics=by_file.get(file, [])))
        self.published = set(result.files) | set(by_file)
        self.window_log_message(types.LogMessageParams(
            types.MessageType.Info, f"rewind: {Path(result.run).name} ran {result.ticks} ticks, "
                                    f"{len(result.problems)} problem(s)"))
        return result

    def show_error(self, exc: Exception) -> None:
        self.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"rewind: {exc}"))


server = RewindLanguageServer()


@server.feature(types.INITIALIZE)
def initialize(ls: RewindLanguageServer, params: types.InitializeParams) -> None:
    ls.initialization_options = params.initialization_options


@server.feature(types.INITIALIZED)
async def initialized(ls: RewindLanguageServer, params: types.InitializedParams) -> None:
    if ls.initialization_options is None:
        return
    try:
        await ls.analyse(AnalysisOptions.parse(ls.initialization_options))
    except RewindError as exc:
        ls.show_error(exc)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
async def did_save(ls: RewindLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
    result = ls.analysis.result
    if ls.options is None or result is None or _path(params.text_document.uri) not in result.files:
        return
    try:
        await ls.analyse(ls.options)
    except RewindError as exc:
        ls.show_error(exc)


@server.feature(types.TEXT_DOCUMENT_HOVER)
async def hover(ls: RewindLanguageServer, params: types.HoverParams) -> types.Hover | None:
    file, line = _path(params.text_document.uri), params.position.line + 1
    if ls.analysis.session is None or line not in ls.analysis.session.program.lines_in(file):
        return None
    position, end, writes = await ls.analysis.call(ls.analysis.writes, file, line)
    return types.Hover(types.MarkupContent(types.MarkupKind.Markdown, hover_markdown(line, position, end, writes)))


@server.command("rewind.analyse")
async def analyse_command(ls: RewindLanguageServer, *args: Any) -> dict:
    """Analyse a program or trace: one argument, the options object. Returns {run, ticks, problems}."""
    if len(args) != 1:
        raise RewindError(f"rewind.analyse takes one argument (the options object), got {len(args)}")
    result = await ls.analyse(AnalysisOptions.parse(args[0]))
    return {"run": result.run, "ticks": result.ticks, "problems": len(result.problems)}


@server.command("rewind.goto")
async def goto_command(ls: RewindLanguageServer, *args: Any) -> dict:
    """Move the hovers' position: one argument, the tick."""
    if len(args) != 1 or not isinstance(args[0], int) or isinstance(args[0], bool):
        raise RewindError(f"rewind.goto takes one argument, a tick (an integer), got {list(args)!r}")
    return {"tick": await ls.analysis.call(ls.analysis.goto, args[0])}


def _path(uri: str) -> str:
    return str(Path(to_fs_path(uri) or uri).resolve())
