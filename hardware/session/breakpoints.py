"""Breakpoints as predicates over positions of the Timeline.

A breakpoint *holds* at a position when its static part matches (the node about to run
begins a line's execution, belongs to a function spec, or the step just taken wrote a
watched value), its condition is true over the values at that position, and its hit
condition accepts the number of such hits since the start of the program. Hits are
counted from the start, not from where the user happens to be, so forward and reverse
execution agree on which hit is the fifth.

The BreakpointTable holds the Session's line, function and data breakpoints: verified against the
Program when set, and asked at each position a motion passes (hardware/session/motion.py) whether one holds.

In a training step (hardware/frontends/torch_train.py) a line runs twice: its forward nodes, and later the backward
nodes that differentiate them (at the same line). A line or function breakpoint's `mode` says which it stops in:
"forward" (the default), "backward" or "both"; the launch's `breakpoint_mode` is the default of every breakpoint.
"""

from __future__ import annotations

import ast
import bisect
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from hardware.errors import ExpressionError, echo
from hardware.events import Output
from hardware.expressions import compile_expression, evaluate, truth
from hardware.line_executions import LineExecutions
from hardware.program import Frame, Program, module_path_text
from hardware.session.state import SessionState
from hardware.source_names import parse_source
from hardware.ticks import Direction, Stop

_HIT_RE = re.compile(r"^\s*(==|>=|<=|>|<|%)?\s*(\d+)\s*$")
MODES = ("forward", "backward", "both")  # which of a line's (or function's) nodes a breakpoint stops in
_PHASES = {"forward": ("forward", "optimizer"), "backward": ("backward",), "both": ("forward", "backward", "optimizer")}


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
    mode: str | None = None  # forward, backward, both (see the module docstring); None: the launch's
    verified: bool = True
    message: str | None = None
    shown: bool = True  # False: a surface's own (a rank's fence), left out of a stop's words and reason
    _cond_cache: dict[int, bool] = field(default_factory=dict, repr=False)

    def accepts_hits(self, hits: int) -> bool:
        if not self.hit_condition:
            return True
        op, n = parse_hit_condition(self.hit_condition)
        return {"==": hits == n, ">=": hits >= n, "<=": hits <= n, ">": hits > n, "<": hits < n,
                "%": n > 0 and hits % n == 0}[op]

    def invalidate(self) -> None:
        self._cond_cache.clear()


@dataclass(frozen=True)
class LineSpec:
    """A breakpoint at a source line: stops where the line's execution begins (a log point prints instead)."""

    line: int
    condition: str | None = None  # an expression over the values there (hardware/expressions.py)
    hit_condition: str | None = None  # N, ==N, >=N, >N, <=N, <N, %N: which hits stop, counted from the start
    log_message: str | None = None  # print this ({expressions} interpolated) instead of stopping
    mode: str | None = None  # stop in the line's forward nodes, its backward nodes, or both; None: the launch's


@dataclass(frozen=True)
class FunctionSpec:
    """A breakpoint on a node name (`softmax_1`), an op (`aten.softmax`), a module path (`blocks.2.attn`, or as
    written from the user's variable: `model.layers.1.mlp`) or a module class (`LlamaRMSNorm`: each instance)."""

    name: str
    condition: str | None = None
    hit_condition: str | None = None
    mode: str | None = None  # forward, backward or both, as a line breakpoint's; None: the launch's


@dataclass(frozen=True)
class DataSpec:
    """A breakpoint on every write of a value, by its Program name."""

    value: str
    condition: str | None = None
    hit_condition: str | None = None


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


def line_positions(program: Program, node_at: Callable[[int], object], end: int, file: str, line: int,
                   phases: Iterable[str] | None = None) -> list[int]:
    """Positions where a line's execution begins, in tick order; with `phases`, only in nodes of those phases. A
    node of another phase than the one before it begins an execution of its own: a line's backward is not more of
    its forward, even where the last forward node and the first backward node are on the same line."""
    out = []
    executions = LineExecutions.of(program)
    prev: tuple[Frame, ...] = ()
    prev_phase = None
    for tick in range(end):
        node = node_at(tick)
        if node is None:
            continue
        frames = node.frames
        if node.phase != prev_phase:
            prev = ()
        for level, f in enumerate(frames):
            if f.loc.file == file and f.loc.line == line:
                if executions.begins(prev, node, level) and (phases is None or node.phase in phases):
                    out.append(tick)
                break
        prev, prev_phase = frames, node.phase
    return out


def function_matches(program: Program, spec: str, mode: str) -> tuple[set[int], set[int]]:
    """The nodes a function breakpoint in `mode` stops at: (those named `spec` or of op `spec`, those inside the
    module `spec` names). In the backward, a node differentiating a node named (or of the op) matches too: it
    computes that node's gradient."""
    found = set(program.find_nodes(spec))
    named = {n for n in found if spec in (program.nodes[n].name, program.nodes[n].op, program.nodes[n].op_short)}
    inside = found - named
    if mode != "forward":
        named |= {n.index for n in program.nodes if n.phase == "backward" and n.differentiates in named}
    phases = _PHASES[mode]
    return ({n for n in named if program.nodes[n].phase in phases},
            {n for n in inside if program.nodes[n].phase in phases})


def function_positions(program: Program, node_at: Callable[[int], object], end: int, spec: str,
                       mode: str = "forward") -> list[int]:
    """Positions of the nodes function_matches gives by name or op, and where execution enters the module `spec`
    names (by its path or its class: entering another instance of the class is another entry; so is entering its
    backward)."""
    named, inside = function_matches(program, spec, mode)
    out = []
    previous: str | None = None  # the module instance the previous node ran in
    prev_phase = None
    for tick in range(end):
        node = node_at(tick)
        if node is None:
            continue
        idx = node.index
        if node.phase != prev_phase:
            previous, prev_phase = None, node.phase
        instance = program.module_instance(node, spec) if idx in inside else None
        if idx in named or (instance is not None and instance != previous):
            out.append(tick)
        previous = instance
    return out


def runs_nowhere(program: Program, what: str, mode: str) -> str:
    """Why a breakpoint on `what` (a line, a function) in `mode` has no node to stop at, though `what` runs."""
    if mode == "backward" and not program.step_starts:
        return ("mode 'backward' stops in the backward of a training step, and this program has none (an inference "
                "pass): launch its training step (entry train_step), or use mode forward")
    if mode == "backward":
        return f"{what} runs no backward node (nothing it computes is differentiated): use mode forward or both"
    return f"{what} runs only in the backward: use mode backward or both"


def missing_function(program: Program, name: str) -> str:
    """Why a function breakpoint names nothing in the Program, with names it does have."""
    paths, classes = program.module_names()
    typed = module_path_text(name)
    rest = typed.partition(".")[2]
    ends = ([p for p in paths if p.endswith("." + typed)]  # as Program.module_instance reads a path's end
            or [p for p in paths if rest[:1].isalpha() and p.endswith("." + rest)])
    if len(ends) > 1:
        return (f"'{echo(name)}' names {len(ends)} modules ({', '.join(ends[:4])}{', ...' if len(ends) > 4 else ''}):"
                " give the whole path")
    close = difflib.get_close_matches(typed, paths + classes, n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    theirs = [(p, c) for n in program.nodes for p, c in n.module_stack if p and not c.startswith("torch.")]
    example_path, example_class = theirs[len(theirs) // 2] if theirs else ("blocks.0.attn", "Attention")
    example_class = example_class.rsplit(".", 1)[-1]
    return (f"no node, op or module path '{echo(name)}' in the program, nor a module class of that name{hint} (try "
            f"a node name, an op like aten.softmax, a module path like {example_path} or a class like {example_class})")


class BreakpointTable:
    """The Session's breakpoints by kind; positions where each one's static part matches are cached until the
    Schedule (or, for a data breakpoint, the write log) changes."""

    def __init__(self, state: SessionState, names_at: Callable[[int], Mapping[str, Any]]):
        self.state = state
        self._names_at = names_at  # name -> value at a position, for conditions and log points
        self.line: dict[str, list[Breakpoint]] = {}  # by resolved file path
        self.function: list[Breakpoint] = []
        self.data: list[Breakpoint] = []
        self._next_id = 1
        self._positions_cache: dict[int, tuple] = {}

    def next_id(self) -> int:
        """Ids are unique across every kind, instruction breakpoints (hardware/session/instruction_cursor.py) included."""
        self._next_id += 1
        return self._next_id - 1

    def validate(self, bp: Breakpoint) -> None:
        try:
            check_breakpoint_expressions(bp.condition, bp.hit_condition, bp.log_message)
        except ExpressionError as exc:
            bp.verified, bp.message = False, str(exc)
        if bp.mode is not None and bp.mode not in MODES:
            bp.verified, bp.message = False, bad_mode(bp.mode)

    def mode_of(self, bp: Breakpoint) -> str:
        """The breakpoint's mode, else the launch's (forward before a launch)."""
        options = self.state.options
        return bp.mode or (options.breakpoint_mode if options is not None else "forward")

    # -- setting ---------------------------------------------------------------------------------------
    def set_line(self, file: str, specs: Iterable[LineSpec]) -> list[Breakpoint]:
        path = str(Path(file).resolve()) if file else file
        result = []
        for spec in specs:
            bp = Breakpoint(self.next_id(), "line", f"{path}:{spec.line}", spec.condition,
                            spec.hit_condition, spec.log_message, file=path, line=int(spec.line), mode=spec.mode)
            self.validate(bp)
            if bp.verified and self.state.program is not None:
                self._bind_line(bp)
            result.append(bp)
        self.line[path] = result
        return result

    def bind_lines(self) -> None:
        """After a launch: bind every line breakpoint to the new Program's lines."""
        for bps in self.line.values():
            for bp in bps:
                if bp.verified:
                    self._bind_line(bp)

    def _bind_line(self, bp: Breakpoint) -> None:
        program = self.state.program
        line, why = resolve_line(program, bp.file, bp.line)
        if line is None:
            bp.verified, bp.message = False, why
            return
        bp.line = line
        mode = self.mode_of(bp)
        if not any(program.nodes[n].phase in _PHASES[mode] for n in program.nodes_at_line(bp.file, line)):
            bp.verified, bp.message = False, runs_nowhere(program, f"line {line}", mode)

    def set_function(self, specs: Iterable[FunctionSpec]) -> list[Breakpoint]:
        program = self.state.program
        self.function = self._named("function", [(spec.name, spec) for spec in specs],
                                    lambda bp: program is None or any(function_matches(program, bp.spec,
                                                                                       self.mode_of(bp))),
                                    lambda bp: missing_function(program, bp.spec) if not program.find_nodes(bp.spec)
                                    else runs_nowhere(program, f"'{echo(bp.spec)}'", self.mode_of(bp)))
        return self.function

    def set_data(self, specs: Iterable[DataSpec]) -> list[Breakpoint]:
        program = self.state.program
        self.data = self._named("data", [(spec.value, spec) for spec in specs],
                                lambda bp: program is not None and bp.spec in program.values,
                                lambda bp: f"no value named '{bp.spec}' in the program")
        return self.data

    def _named(self, kind: str, specs: list[tuple[str, FunctionSpec | DataSpec]],
               exists: Callable[[Breakpoint], bool], missing: Callable[[Breakpoint], str]) -> list[Breakpoint]:
        """Breakpoints on things named in the Program: verified when their expressions parse and the name exists
        (a function breakpoint's: in its mode)."""
        result = []
        for name, spec in specs:
            bp = Breakpoint(self.next_id(), kind, name, spec.condition, spec.hit_condition,
                            mode=spec.mode if isinstance(spec, FunctionSpec) else None)
            self.validate(bp)
            if bp.verified and not exists(bp):
                bp.verified, bp.message = False, missing(bp)
            result.append(bp)
        return result

    def verified(self) -> list[Breakpoint]:
        out = [bp for bps in self.line.values() for bp in bps]
        return [bp for bp in out + self.function + self.data if bp.verified]

    def invalidate_conditions(self) -> None:
        """An edit changed values: every condition is evaluated again."""
        for bp in self.verified():
            bp.invalidate()

    # -- holding ---------------------------------------------------------------------------------------
    def stop_at(self, q: int, direction: Direction) -> Stop | None:
        """The stop at position q where breakpoints hold there; log points print (going forward) instead."""
        hit: list[Breakpoint] = []
        for bp in self._holding(q):
            if bp.log_message is not None:
                if direction is Direction.FORWARD:
                    self.state.on_event(Output(self._interpolate(bp.log_message, q) + "\n", "log"))
                continue
            hit.append(bp)
        return _stop(q, hit, self.mode_of) if hit else None

    def stops(self, start: int, stop: int) -> list[Stop]:
        """The stops breakpoints make at positions start..stop - 1 (log points never stop, and print nothing)."""
        stopping = [bp for bp in self.verified() if bp.log_message is None]
        candidates = sorted({q for bp in stopping for q in self._static_positions(bp)[0] if start <= q < stop})
        found = []
        for q in candidates:
            hit = [bp for bp in stopping if self._holds(bp, q, self._static_positions(bp))]
            if hit:
                found.append(_stop(q, hit, self.mode_of))
        return found

    def next_position(self, q: int) -> int | None:
        """The first position at or after q where a line or function breakpoint's static part matches (None: no
        such breakpoint stops there; a data breakpoint's positions are its writes, known once they ran)."""
        found = None
        for bp in self.verified():
            if bp.kind == "data":
                continue
            positions = self._static_positions(bp)[0]
            i = bisect.bisect_left(positions, q)
            if i < len(positions) and (found is None or positions[i] < found):
                found = positions[i]
        return found

    def _holding(self, q: int) -> list[Breakpoint]:
        return [bp for bp in self.verified() if self._holds(bp, q, self._static_positions(bp))]

    def _static_positions(self, bp: Breakpoint) -> tuple[list[int], frozenset[int]]:
        """Positions where the breakpoint's static part matches (cached until the schedule changes)."""
        tl, program = self.state.tl, self.state.program
        key = (bp.id, tl.end, len(tl.log) if bp.kind == "data" else 0, id(tl))
        cached = self._positions_cache.get(bp.id)
        if cached is not None and cached[0] == key:
            return cached[1]
        if bp.kind == "line":
            found = line_positions(program, tl.node_at, tl.end, bp.file, bp.line, _PHASES[self.mode_of(bp)])
        elif bp.kind == "function":
            found = function_positions(program, tl.node_at, tl.end, bp.spec, self.mode_of(bp))
        else:
            found = [r.tick + 1 for r in tl.log.history(bp.spec)]
        self._positions_cache[bp.id] = (key, (found, frozenset(found)))
        return found, frozenset(found)

    def _holds(self, bp: Breakpoint, q: int, static: tuple[list[int], frozenset[int]]) -> bool:
        positions, members = static
        if q not in members:
            return False
        if bp.condition or bp.hit_condition:
            hits = 0
            for p in positions:
                if p > q:
                    break
                if self._condition(bp, p):
                    hits += 1
            return self._condition(bp, q) and bp.accepts_hits(hits)
        return True

    def _condition(self, bp: Breakpoint, q: int) -> bool:
        if not bp.condition:
            return True
        if q not in bp._cond_cache:
            try:
                bp._cond_cache[q] = truth(evaluate(bp.condition, self._names_at(q)))
            except ExpressionError as exc:
                self.state.on_event(Output(f"breakpoint {bp.id} condition failed at tick {q}: {exc}\n", "error"))
                bp._cond_cache[q] = True  # an unevaluable condition stops, so the user sees why
        return bp._cond_cache[q]

    def _interpolate(self, message: str, q: int) -> str:
        def sub(m):
            try:
                return _short(evaluate(m[1], self._names_at(q)))
            except ExpressionError as exc:
                return f"<{exc}>"
        return re.sub(r"\{([^{}]+)\}", sub, message)


def _stop(q: int, hit: list[Breakpoint], mode_of: Callable[[Breakpoint], str]) -> Stop:
    """The stop of breakpoints that hold at q: named by every one's id, said in the words of those shown (of all,
    when none is)."""
    said = [bp for bp in hit if bp.shown] or hit
    kinds = {bp.kind for bp in said}
    reason = "data breakpoint" if kinds == {"data"} else (
        "function breakpoint" if kinds == {"function"} else "breakpoint")
    return Stop(reason, q, ", ".join(_describe(bp, mode_of(bp)) for bp in said), [bp.id for bp in hit])


def _describe(bp: Breakpoint, mode: str) -> str:
    shown = f" ({mode})" if mode != "forward" else ""
    if bp.kind == "line":
        return f"breakpoint {bp.id} at {Path(bp.file).name}:{bp.line}{shown}"
    if bp.kind == "function":
        return f"breakpoint {bp.id} on {bp.spec}{shown}"
    return f"data breakpoint {bp.id}: write to {bp.spec}"


def bad_mode(mode: Any) -> str:
    return f"breakpoint mode '{echo(str(mode))}' is not one of {', '.join(MODES)}"


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.numel() == 1:
            return f"{value.item():.6g}" if value.is_floating_point() else str(value.item())
        return f"tensor(shape={list(value.shape)}, dtype={str(value.dtype).removeprefix('torch.')})"
    return str(value)
