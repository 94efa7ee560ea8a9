"""Problems as LSP diagnostics and line writes as hover markdown."""

from __future__ import annotations

from lsprotocol import types

from hardware.program import Frame
from provenance.problems import Problem
from provenance.line_writes import LineWrite
from pygls.uris import from_fs_path

SEVERITY = {"error": types.DiagnosticSeverity.Error, "warning": types.DiagnosticSeverity.Warning,
            "information": types.DiagnosticSeverity.Information}
MAX_RUNS_SHOWN = 3


def diagnostics_by_file(problems: list[Problem], sources: dict[str, str]) -> dict[str, list[types.Diagnostic]]:
    """Each problem at its node's innermost user line, its callers as related information."""
    out: dict[str, list[types.Diagnostic]] = {}
    for problem in problems:
        if not problem.frames:
            continue
        where, *callers = reversed(problem.frames)
        related = [types.DiagnosticRelatedInformation(_location(f, sources), f"called from {_frame_name(f)}")
                   for f in callers]
        out.setdefault(where.loc.file, []).append(types.Diagnostic(
            range=_line_range(where, sources), message=problem.message, severity=SEVERITY[problem.severity],
            source="rewind", code=problem.kind, related_information=related or None))
    return out


def hover_markdown(line: int, position: int, end: int, writes: list[LineWrite]) -> str:
    head = f"**Rewind** · line {line} at tick {position} of {end}"
    if not writes:
        return f"{head}\n\nThis line has written nothing by tick {position}."
    shown = writes[-MAX_RUNS_SHOWN:]
    more = f"\n\n…and {len(writes) - len(shown)} earlier runs of this line." if len(writes) > len(shown) else ""
    return head + "".join(f"\n\n{_describe(w)}" for w in reversed(shown)) + more


def _describe(write: LineWrite) -> str:
    rec, s = write.record, write.stats
    name = f"`{' = '.join(write.names)} = {rec.value}`" if write.names else f"`{rec.value}`"
    bad = "".join(f" · **{s[k]} {k.upper() if k == 'nan' else 'Inf'}**" for k in ("nan", "inf") if s[k])
    loc = rec.location
    module = write.run.instance[2]
    return (f"{name} · {rec.dtype}{list(rec.shape)} · min {s['min']:.6g} · max {s['max']:.6g} · "
            f"mean {s['mean']:.6g}{bad}  \n"
            f"written by `{rec.op}` node `{rec.node_name}` at tick {rec.tick} on unit {rec.unit}"
            f"{f' in `{module}`' if module else ''}  \n"
            f"at {loc.chip} {loc.space} 0x{loc.address:x} ({loc.nbytes} bytes, {rec.kind})"
            + (f" · {len(write.run.nodes)} nodes on this line" if len(write.run.nodes) > 1 else ""))


def _line_range(frame: Frame, sources: dict[str, str]) -> types.Range:
    lines = sources.get(frame.loc.file, "").splitlines()
    text = lines[frame.loc.line - 1] if frame.loc.line <= len(lines) else ""
    start = len(text) - len(text.lstrip())
    return types.Range(types.Position(frame.loc.line - 1, start), types.Position(frame.loc.line - 1, len(text)))


def _location(frame: Frame, sources: dict[str, str]) -> types.Location:
    return types.Location(from_fs_path(frame.loc.file), _line_range(frame, sources))


def _frame_name(frame: Frame) -> str:
    owner = f"{frame.module_class}.{frame.loc.function}" if frame.module_class else frame.loc.function
    return f"{owner} [{frame.module_path or '<root>'}]" if frame.module_path is not None else owner
