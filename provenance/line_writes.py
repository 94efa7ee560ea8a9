"""What a source line wrote by a position: its runs, each run's result value, stats, location and writer.

A line runs once per execution in a frame instance (`scores = ...` runs in blocks.0.attn and
again in blocks.1.attn); a run is the consecutive nodes that execution made, and the line's
result is what the run's last node wrote (the value its assignment target receives).
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware.program import Program
from hardware.source_names import assignments, frame_instance
from provenance.handed import SessionView
from provenance.writelog import WriteRecord


@dataclass(frozen=True)
class LineRun:
    nodes: tuple[int, ...]  # node indices, in execution order
    instance: tuple  # the frame instance (file, function, module path) the line ran in


@dataclass(frozen=True)
class LineWrite:
    run: LineRun
    names: tuple[str, ...]  # the source names the result was assigned to (`scores`), if any
    record: WriteRecord  # the write of the result, with its location and writer
    stats: dict  # min, max, mean, nan, inf of the result as written


def line_runs(program: Program, file: str, line: int) -> list[LineRun]:
    runs: list[LineRun] = []
    for index in program.nodes_at_line(file, line):
        frame = next(f for f in program.nodes[index].frames if (f.loc.file, f.loc.line) == (file, line))
        instance = frame_instance(frame)
        if runs and runs[-1].nodes[-1] == index - 1 and runs[-1].instance == instance:
            runs[-1] = LineRun(runs[-1].nodes + (index,), instance)
        else:
            runs.append(LineRun((index,), instance))
    return runs


def line_writes(session: SessionView, file: str, line: int, position: int | None = None) -> list[LineWrite]:
    """The results of every run of `file:line` that finished by `position` (default: the session's), oldest first."""
    tl = session.tl
    pos = tl.position if position is None else position
    bound = {(a.node, a.frame): a.names for a in assignments(session.program)}
    out = []
    for run in line_runs(session.program, file, line):
        tick = tl.node_tick[run.nodes[-1]]
        if tick >= pos:
            continue
        node = session.program.nodes[run.nodes[-1]]
        record = next(r for r in tl.log.at_tick(tick) if r.value == node.outputs[0])
        names = tuple(n for n, v in bound.get((run.nodes[-1], run.instance), {}).items() if v == record.value)
        out.append(LineWrite(run, names, record,
                             session.value_stats(record.value, tick + 1)))
    return out
