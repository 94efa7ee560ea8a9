"""A candidate's blocked loop, as its Program records it: the iterations (a Python loop is unrolled by export, so
the lines of its body run once per iteration), the blocks of the inputs each iteration reads, and the values it
carries from one iteration to the next and to the lines after the loop (named by the user's variables)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from hardware.program import Program, Ref
from hardware.source_names import assignments, parse_source


@dataclass(frozen=True)
class Read:
    """An iteration's slice of an input: `input[start:end]` along `dim`."""

    input: str
    dim: int
    start: int
    end: int
    node: int


@dataclass
class Loop:
    starts: list[int]  # the first node of each iteration
    end: int  # the first node after the loop (the epilogue's first)
    line: int | None  # the loop statement's line (`for start in range(...)`)
    file: str
    reads: list[list[Read]] = field(default_factory=list)  # per iteration
    names: list[dict[str, str]] = field(default_factory=list)  # per iteration: variable -> the value it holds last
    lines: dict[str, int] = field(default_factory=dict)  # variable -> the line that assigns it in the loop

    def iteration_of(self, node: int) -> int | None:
        if not self.starts or node < self.starts[0] or node >= self.end:
            return None
        return max(j for j, s in enumerate(self.starts) if s <= node)

    def covered(self, program: Program) -> dict[tuple[str, int], list[int]]:
        """(input, dim) -> the end of the prefix read after each iteration."""
        out: dict[tuple[str, int], list[int]] = {}
        for key in {(r.input, r.dim) for reads in self.reads for r in reads}:
            size, reached, ends = program.values[key[0]].shape[key[1]], 0, []
            for reads in self.reads:
                reached = max([reached] + [min(r.end, size) for r in reads if (r.input, r.dim) == key])
                ends.append(reached)
            out[key] = ends
        return out


def find_loop(program: Program) -> Loop | None:
    """The loop whose body reads blocks of the inputs, or None (no line runs twice, or nothing is read by block)."""
    runs = _runs(program)
    counts: dict[tuple, int] = {}
    for key, _, _ in runs:
        counts[key] = counts.get(key, 0) + 1
    body = [(key, s, e) for key, s, e in runs if counts[key] > 1]
    if not body:
        return None
    first = body[0][0]
    starts = [s for key, s, _ in body if key == first]
    loop = Loop(starts, body[-1][2], _loop_line(program, first), first[0])
    for j, start in enumerate(starts):
        stop = starts[j + 1] if j + 1 < len(starts) else loop.end
        loop.reads.append([r for r in _reads(program) if start <= r.node < stop])
    if not any(loop.reads):
        return None
    named = [a for a in assignments(program) if loop.iteration_of(a.node) is not None]
    loop.names = [{} for _ in starts]
    for a in named:
        for name, value in a.names.items():
            loop.names[loop.iteration_of(a.node)][name] = value
            loop.lines.setdefault(name, program.nodes[a.node].loc.line)
    return loop


def _runs(program: Program) -> list[tuple[tuple, int, int]]:
    """Consecutive nodes of one source line: (file, line), first node, one past the last."""
    runs: list[tuple[tuple, int, int]] = []
    for node in program.nodes:
        key = (node.loc.file, node.loc.line) if node.loc else None
        if runs and runs[-1][0] == key:
            runs[-1] = (key, runs[-1][1], node.index + 1)
        else:
            runs.append((key, node.index, node.index + 1))
    return [r for r in runs if r[0] is not None]


def _reads(program: Program) -> list[Read]:
    out = []
    for node in program.nodes:
        if node.op != "aten.slice.Tensor" or not node.args or not isinstance(node.args[0], Ref):
            continue
        source = program.values[node.args[0].name]
        if source.kind != "input":
            continue
        dim, start, end = (list(node.args[1:4]) + [0, 0, None])[:3]
        size = source.shape[dim] if -len(source.shape) <= dim < len(source.shape) else 0
        dim = dim % len(source.shape) if source.shape else 0
        start = start or 0
        end = size if end is None else end
        start, end = (start + size if start < 0 else start), (end + size if end < 0 else end)
        out.append(Read(source.name, dim, max(0, start), min(size, end), node.index))
    return out


def _loop_line(program: Program, key: tuple) -> int | None:
    """The `for`/`while` statement around the line `key` (file, line), read from the file's source."""
    tree = parse_source(program.source_files.get(key[0]))
    if tree is None:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While)) and node.lineno < key[1] <= (node.end_lineno or node.lineno):
            if found is None or node.lineno > found.lineno:
                found = node
    return found.lineno if found else None
