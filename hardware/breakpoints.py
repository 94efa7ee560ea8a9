"""Breakpoints as predicates over positions of the Timeline.

A breakpoint *holds* at a position when its static part matches (the node about to run
begins a line's execution, belongs to a function spec, or the step just taken wrote a
watched value), its condition is true over the values at that position, and its hit
condition accepts the number of such hits since the start of the program. Hits are
counted from the start, not from where the user happens to be, so forward and reverse
execution agree on which hit is the fifth.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hardware.errors import ExpressionError
from hardware.expressions import compile_expression
from hardware.program import Frame, Program
from hardware.source_names import parse_source

_HIT_RE = re.compile(r"^\s*(==|>=|<=|>|<|%)?\s*(\d+)\s*$")


@dataclass
class Breakpoint:
    id: int
    kind: str  # "line", "function", "data"
    spec: str  # "file:line", a function spec, or a value name
    condition: str | None = None
    hit_condition: str | None = None
    log_message: str | None = None
    file: str | None = None
    line: int | None = None
    verified: bool = True
    message: str | None = None
    _cond_cache: dict[int, bool] = field(default_factory=dict, repr=False)

    def accepts_hits(self, hits: int) -> bool:
        if not self.hit_condition:
            return True
        op, n = parse_hit_condition(self.hit_condition)
        return {"==": hits == n, ">=": hits >= n, "<=": hits <= n, ">": hits > n, "<": hits < n,
                "%": n > 0 and hits % n == 0}[op]

    def invalidate(self) -> None:
        self._cond_cache.clear()


def parse_hit_condition(text: str) -> tuple[str, int]:
    m = _HIT_RE.match(text)
    if not m:
        raise ExpressionError(f"hit condition '{text}' is not a number or one of ==N, >=N, >N, <=N, <N, %N")
    return m[1] or "==", int(m[2])


def check_breakpoint_expressions(condition: str | None, hit_condition: str | None, log_message: str | None) -> None:
    if condition:
        compile_expression(condition)
    if hit_condition:
        parse_hit_condition(hit_condition)
    for expr in re.findall(r"\{([^{}]+)\}", log_message or ""):
        compile_expression(expr)


def _frame_key(f: Frame) -> tuple:
    return (f.loc.file, f.loc.line, f.module_path)


def line_begins(frames_prev: tuple[Frame, ...], frames: tuple[Frame, ...], level: int) -> bool:
    """Does the line at frames[level] begin executing here (after frames_prev)?"""
    if len(frames_prev) <= level:
        return True
    if [_frame_key(f) for f in frames_prev[: level + 1]] != [_frame_key(f) for f in frames[: level + 1]]:
        return True
    # Same line, same frames: a new call from it into another instance of the same code is a new execution
    # (a loop over layers calls Block.forward of blocks.0, then of blocks.1).
    if len(frames_prev) > level + 1 and len(frames) > level + 1:
        a, b = frames_prev[level + 1], frames[level + 1]
        return (a.loc.file, a.loc.function) == (b.loc.file, b.loc.function) and a.module_path != b.module_path
    return False


def resolve_line(program: Program, file: str, line: int) -> tuple[int | None, str | None]:
    """The line a breakpoint binds to: `line` if a node runs there, else the next line with one in the same
    function; (None, reason) when there is none."""
    lines = program.lines_in(file)
    if not lines:
        known = ", ".join(Path(f).name for f in program.files()) or "none"
        return None, f"no node of the program comes from {file} (program files: {known})"
    if line in lines:
        return line, None
    later = [ln for ln in lines if ln > line]
    func = _function_span(program.source_files.get(file), line)
    if later and func and later[0] <= func[1]:
        return later[0], None
    return None, f"no node runs at line {line}: it performs no tensor operation"


def _function_span(source: str | None, line: int) -> tuple[int, int] | None:
    tree = parse_source(source)
    if tree is None:
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0):
            if best is None or node.lineno > best[0]:
                best = (node.lineno, node.end_lineno or node.lineno)
    return best


def line_positions(program: Program, node_at: Callable[[int], object], end: int, file: str, line: int) -> list[int]:
    """Positions where a line's execution begins, in tick order."""
    out = []
    prev: tuple[Frame, ...] = ()
    for tick in range(end):
        node = node_at(tick)
        if node is None:
            continue
        frames = node.frames
        for level, f in enumerate(frames):
            if f.loc.file == file and f.loc.line == line:
                if line_begins(prev, frames, level):
                    out.append(tick)
                break
        prev = frames
    return out


def function_positions(program: Program, node_at: Callable[[int], object], end: int, spec: str) -> list[int]:
    """Positions of nodes named `spec` or of op `spec`, or where execution enters module path `spec`."""
    matches = set(program.find_nodes(spec))
    by_op_or_name = {n for n in matches if spec in (program.nodes[n].name, program.nodes[n].op,
                                                    program.nodes[n].op_short)}
    out = []
    prev_in_module = False
    for tick in range(end):
        node = node_at(tick)
        if node is None:
            continue
        idx = node.index
        in_module = idx in matches and idx not in by_op_or_name
        if idx in by_op_or_name or (in_module and not prev_in_module):
            out.append(tick)
        prev_in_module = in_module
    return out
