"""Positions inside nodes, for the Session on an InstructionDriver (the `sim` chip).

The Timeline's position p is a node; inside it, the cursor's `step` k counts the steps of the
node's recorded interleaving that have run. (p, 0) is the node boundary p; for a node that ran
to completion (p, n) is (p + 1, 0), for a node that hung (p, n) is the hung state. Moving back
is moving the cursor: the driver restores the node's start and replays its Schedule to k.

Instruction breakpoints and the `race` and `hang` exception filters are answered from the
recorded Schedules (which unit ran which instruction at each step), without replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from hardware.errors import ExpressionError, RewindError
from hardware.events import ExceptionDetails, Output
from hardware.expressions import evaluate, truth
from hardware.instructions import InstructionDriver, NodeSchedule, RaceReport
from hardware.session.breakpoints import Breakpoint, BreakpointTable
from hardware.session.exception_filters import ExceptionFilters
from hardware.session.state import FrameInfo, SessionState
from hardware.ticks import Direction, Stop, Tick

if TYPE_CHECKING:
    from checkpoint.timeline import Timeline
    from hardware.program import Node

FORWARD = Direction.FORWARD
CHIP_FILTERS = {"race", "hang", "access", "divergence"}  # filters a node's recorded Schedule may answer (a kernel's
# divergence from its reference is found by its driver, at the store that went wrong)
Targets = Callable[[Tick, NodeSchedule | None], np.ndarray]  # positions k of the node at a tick a motion may stop at


@dataclass
class InstructionBreakpoint(Breakpoint):
    node: int = -1
    unit: int = -1
    pc: int = -1


@dataclass
class CodeLineBreakpoint(Breakpoint):
    """A line breakpoint on a line of the chip's own code (a kernel's), bound to the instructions at that line: it
    holds where a unit begins executing the line; its condition is over that unit's local values there."""

    at: frozenset = frozenset()  # (unit, pc) of the instructions at the line, and the first of each run of them


@dataclass
class ElementBreakpoint(Breakpoint):
    """A data breakpoint on a tensor of the chip's own code, or one element of it (`out_ptr[37]`), on a chip that
    records which step writes each element (a kernel's): it holds right after each such write."""


@dataclass(frozen=True)
class InstructionSpec:
    """A breakpoint before a unit executes the instruction at a code address (from disassemble)."""

    reference: str  # the address, as text: `0x1f40`
    offset: int = 0  # bytes added to the address
    condition: str | None = None  # refused: an instruction breakpoint takes a hit condition only
    hit_condition: str | None = None


class InstructionCursor:
    def __init__(self, state: SessionState, table: BreakpointTable, exceptions: ExceptionFilters,
                 stopped: Callable[[Stop], Stop], write_value: Callable[[str, int, bytes], int],
                 breakpoints: Iterable[InstructionBreakpoint] = ()):
        """`breakpoints` (of an earlier launch) are bound again to this one's code. `stopped` ends a motion
        (the Session's), `write_value` edits a value's bytes (its inspection's)."""
        self.state, self.table, self.exceptions = state, table, exceptions
        self._stopped, self._write_value = stopped, write_value
        self._at: tuple[int, int, int] | None = None  # (tick, node index, step)
        self.breakpoints: list[InstructionBreakpoint] = [bp for bp in breakpoints
                                                         if isinstance(bp, InstructionBreakpoint)]
        self.code_lines: dict[str, list[CodeLineBreakpoint]] = {}
        self._lines: dict[str, dict[int, set[tuple[int, int]]]] = {}
        self.element_bps: list[ElementBreakpoint] = []
        for bp in self.breakpoints:
            bp.verified, bp.message = True, None
            self.table.validate(bp)
            self._bind(bp, InstructionSpec(bp.spec))
        for bp in breakpoints:
            if isinstance(bp, CodeLineBreakpoint):
                bp.verified, bp.message = True, None
                self.table.validate(bp)
                self._bind_line(bp)
                self.code_lines.setdefault(bp.file, []).append(bp)

    @property
    def tl(self) -> "Timeline":
        return self.state.tl

    @property
    def driver(self) -> InstructionDriver:
        return self.tl.driver

    # -- where we are ------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Steps of the current node that have run (0 at a node boundary, or after any node-level motion)."""
        at, tl = self._at, self.tl
        if at is None or at[0] != tl.position:
            return 0
        node = tl.node_at(at[0])
        return at[2] if node is not None and node.index == at[1] else 0

    def place(self, tick: Tick, step: int) -> None:
        node = self.tl.node_at(tick)
        self._at = (tick, node.index, step) if step and node is not None else None

    def schedule(self, tick: Tick) -> NodeSchedule | None:
        """The recorded Schedule of the node at `tick` (run first if it never ran); None for an edit step."""
        node = self.tl.node_at(tick)
        if node is None:
            return None
        self._ensure_run(tick)
        return self.driver.schedule(node.index)

    def _ensure_run(self, tick: Tick) -> None:
        tl = self.tl
        if tick >= tl.frontier:
            here = tl.position
            tl.seek(tick + 1)
            tl.seek(here)

    def _last(self, sched: NodeSchedule | None) -> int:
        """The step index that is the next boundary: positions inside are 0 .. last - 1."""
        return 1 if sched is None else sched.positions

    def chip(self, tick: Tick | None = None, step: int | None = None):
        """The chip inside the node at `tick` after `step` steps (default: the cursor's)."""
        tl = self.tl
        tick = tl.position if tick is None else tick
        node = tl.node_at(tick)
        if node is None:
            raise RewindError(f"tick {tick} runs no node on the chip")
        self._ensure_run(tick)
        args, kwargs = node.bind(lambda n: tl.value(n, tick))
        return self.driver.chip_at(node, args, kwargs, self.step if step is None else step)

    # -- motion ---------------------------------------------------------------------------------------
    def walk(self, direction: Direction, targets: Targets, unit: int | None = None) -> Stop:
        """Move to the nearest position in `direction` that `targets` names, unless an instruction
        breakpoint or an exception filter stops the motion first."""
        tl = self.tl
        tick, k0, first = tl.position, self.step, True
        forward = direction is FORWARD
        while True:
            if forward and tick >= tl.end:
                return self._stop(Stop("end", tl.end, "end of program"), 0)
            if not forward and tick < 0:
                return self._stop(Stop("entry", 0, "beginning of the program"), 0)
            sched = self.schedule(tick)
            last = self._last(sched)
            lo, hi = ((k0 if first else 0), last + 1) if forward else (-1, (k0 if first else last))
            found = self._nearest(tick, sched, lo, hi, direction, targets(tick, sched), unit)
            if found is not None:
                return self._stop(*found)
            if self.state.pause.is_set():
                return self._stop(Stop("pause", tick, "paused"), 0)
            tick, first = tick + (1 if forward else -1), False

    def _nearest(self, tick: Tick, sched: NodeSchedule | None, lo: int, hi: int, direction: Direction,
                 targets: np.ndarray, unit: int | None) -> tuple[Stop, int] | None:
        """The first position strictly between lo and hi (in direction order) where a target or a stop is."""
        candidates = self.stops(tick, sched)
        inside = targets[(targets > lo) & (targets < hi)]
        if len(inside):
            k = int(inside.min() if direction is FORWARD else inside.max())
            candidates.setdefault(k, lambda: Stop("step", tick, f"step {k} of tick {tick}", unit=unit))
        ks = [k for k in candidates if lo < k < hi]
        if not ks:
            return None
        k = min(ks) if direction is FORWARD else max(ks)
        stop = candidates[k]()
        last = self._last(sched)
        if k >= last:  # the node's end is the next node's boundary
            return _at(stop, tick + 1), 0
        return stop, k

    def _stop(self, stop: Stop, step: int) -> Stop:
        self.tl.seek(stop.tick)
        stop.instruction = step
        return self._stopped(stop)

    def crossing(self, tick: Tick, lo: int, hi: int | None, direction: Direction) -> Stop | None:
        """For the Session's node-level motions: the first instruction-level stop strictly inside (lo, hi)
        of the node at `tick` (hi None: up to and including its end). Sets the cursor when found."""
        if not 0 <= tick < self.tl.end or self.tl.node_at(tick) is None:
            return None
        if not (self.breakpoints or self._code_line_bps() or self.element_bps or CHIP_FILTERS & self.exceptions.filters):
            return None
        sched = self.schedule(tick)
        hi = self._last(sched) + 1 if hi is None else hi
        found = self._nearest(tick, sched, lo, hi, direction, np.zeros(0, np.int64), None)
        if found is None:
            return None
        stop, step = found
        self.place(stop.tick, step)
        stop.instruction = step
        return stop

    def step_instruction(self, direction: Direction, unit: int | None, single_thread: bool) -> Stop:
        """One step of the interleaving; of `unit` (the others run as recorded); or of `unit` alone."""
        if unit is None or unit == 0:
            return self.walk(direction, _every)
        self._take(unit, direction, single_thread)

        def of_unit(tick: Tick, sched: NodeSchedule | None) -> np.ndarray:
            if sched is None:
                return np.zeros(0, np.int64)
            steps = np.flatnonzero(sched.units == unit)
            return steps + 1 if direction is FORWARD else steps

        return self.walk(direction, of_unit, unit)

    def steps_lines(self, unit: int) -> bool:
        """Do `unit`'s instructions run at source lines of their own (a kernel program's, at its kernel lines)?"""
        tl = self.tl
        node = tl.node_at(min(tl.position, tl.end - 1)) if tl.end else None
        return 0 < unit < len(tl.unit_names) and node is not None and any(
            i.line is not None for i in self.driver.disassemble(node.index, unit))

    def step_line(self, direction: Direction, unit: int, single_thread: bool) -> Stop:
        """`unit` to the next line of its own code it executes (the others run as recorded; `single_thread`: it
        alone): forward, to where its next instruction is at another line than the one it is at, or to where it
        has finished; back, to where it began executing the line it is in, or, where it is about to begin one, the
        line before. A line run again by the next instruction (a loop of one line) is one execution of it."""
        self._take(unit, direction, single_thread)

        def line_edges(tick: Tick, sched: NodeSchedule | None) -> np.ndarray:
            node = self.tl.node_at(tick) if sched is not None else None
            if node is None:
                return np.zeros(0, np.int64)
            at: dict[tuple, int] = {}
            lines = np.array([at.setdefault((i.file, i.line), len(at))
                              for i in self.driver.disassemble(node.index, unit)] + [-1], np.int64)
            steps = np.flatnonzero(sched.units == unit)
            pcs = sched.pcs[steps]
            if direction is FORWARD:  # right after its last instruction at a line
                return steps[lines[pcs + 1] != lines[pcs]] + 1
            return steps[(pcs == 0) | (lines[pcs - 1] != lines[pcs])]  # right before its first one

        return self.walk(direction, line_edges, unit)

    def _take(self, unit: int, direction: Direction, single_thread: bool) -> None:
        """Check `unit` for a step of its own; with `single_thread`, make it take the next step forward."""
        if not 0 < unit < len(self.tl.unit_names):
            raise RewindError(f"no unit {unit}: the chip's units are 0..{len(self.tl.unit_names) - 1}")
        if single_thread and direction is FORWARD:
            self._force(unit)

    def _force(self, unit: int) -> None:
        """Make `unit` take the next step of the current node: its interleaving is rewritten from here."""
        tl, tick, k = self.tl, self.tl.position, self.step
        sched = self.schedule(tick)
        if sched is None or k >= len(sched) or int(sched.units[k]) == unit:
            return
        name = tl.unit_name(unit)
        state = next(u for u in self.chip(tick, k).units() if u.unit == unit)
        if state.status not in ("ready", "busy"):
            raise RewindError(f"{name} cannot step alone at step {k} of tick {tick}: {state.detail}")
        node = tl.node_at(tick)
        edits = self.driver.edits(node.index)
        tl.forget_from(tick)
        self.driver.rewrite(node.index, [int(u) for u in sched.units[:k]] + [unit], edits)
        self._ensure_run(tick)
        self.place(tick, k)
        self.state.on_event(Output(
            f"{name} stepped alone at step {k} of '{node.name}': the node's interleaving changed there, "
            "so its recorded future is forgotten and runs again\n"))

    # -- instruction breakpoints and exception filters --------------------------------------------------
    def stops(self, tick: Tick, sched: NodeSchedule | None) -> dict[int, Callable[[], Stop]]:
        """Every instruction-level stop inside the node at `tick`, by step (made when chosen)."""
        out: dict[int, Callable[[], Stop]] = {}
        if sched is None:
            return out
        node = self.tl.node_at(tick)
        if sched.hang is not None and "hang" in self.exceptions.filters:
            out[sched.hang.step] = lambda: self._hang_stop(tick, node, sched)
        if "race" in self.exceptions.filters:
            for race in reversed(sched.races):
                out[race.second_step + 1] = lambda race=race: self._race_stop(tick, node, race)
        for found in reversed(sched.findings):
            if found.filter in self.exceptions.filters:
                out[found.step + 1] = lambda found=found: self._exception(
                    tick, node, found.filter, found.message, found.detail | {"unit": self.tl.unit_name(found.unit)},
                    node.outputs[0], 1, found.unit)
        for k, bps in self._element_hits(node.index).items():
            out[k] = lambda k=k, bps=bps: Stop("data breakpoint", tick, ", ".join(
                f"data breakpoint {bp.id}: {self.tl.unit_name(int(sched.units[k - 1]))} writes {what}"
                for bp, what in bps), [bp.id for bp, _ in bps], unit=int(sched.units[k - 1]))
        for k, bps in self._code_line_hits(tick, sched).items():
            out[k] = lambda k=k, bps=bps: Stop("breakpoint", tick, ", ".join(
                f"breakpoint {bp.id} at {Path(bp.file).name}:{bp.line}" for bp in bps), [bp.id for bp in bps],
                unit=int(sched.units[k]))
        hits: dict[int, list[InstructionBreakpoint]] = {}
        for bp in self.breakpoints:
            if bp.verified and bp.node == node.index:
                for k in _hits(bp, sched):
                    hits.setdefault(k, []).append(bp)
        for k, bps in hits.items():
            out[k] = lambda bps=bps: Stop("instruction breakpoint", tick, ", ".join(
                f"instruction breakpoint {bp.id} at {bp.spec}" for bp in bps), [bp.id for bp in bps], unit=bps[0].unit)
        return out

    # -- line breakpoints on the chip's own code ----------------------------------------------------------
    def has_code_lines(self, file: str) -> bool:
        """Does the chip's code (the instructions of the program's nodes) have lines in `file`?"""
        return bool(self._lines_in(str(Path(file).resolve()) if file else file))

    def _lines_in(self, file: str) -> dict[int, set[tuple[int, int]]]:
        """line -> (unit, pc) of the instructions at it, over every unit of every node (a launch's code is fixed)."""
        if file in self._lines:
            return self._lines[file]
        out: dict[int, set[tuple[int, int]]] = {}
        self._lines[file] = out
        for node in self.tl.program.nodes:
            for unit in range(1, len(self.tl.unit_names)):
                for info in self.driver.disassemble(node.index, unit):
                    if info.line is not None and info.file == file:
                        out.setdefault(info.line, set()).add((unit, info.pc))
        return out

    def set_code_line_breakpoints(self, file: str, specs: Iterable) -> list[Breakpoint]:
        """Replace the breakpoints of `file`, a file of the chip's code (LineSpecs)."""
        path = str(Path(file).resolve())
        out = []
        for spec in specs:
            bp = CodeLineBreakpoint(self.table.next_id(), "line", f"{path}:{spec.line}", spec.condition,
                                    spec.hit_condition, spec.log_message, file=path, line=int(spec.line))
            self.table.validate(bp)
            if bp.verified:
                self._bind_line(bp)
            out.append(bp)
        self.code_lines[path] = out
        return out

    def _bind_line(self, bp: CodeLineBreakpoint) -> None:
        lines = self._lines_in(bp.file)
        later = [ln for ln in sorted(lines) if ln >= bp.line]
        if not later or later[0] > bp.line + 3:
            bp.verified, bp.message = False, f"no operation of the kernel runs at line {bp.line}"
            return
        bp.line = later[0]
        starts = set()
        for unit, pc in lines[bp.line]:
            if (unit, pc - 1) not in lines[bp.line]:
                starts.add((unit, pc))
        bp.at = frozenset(starts)

    # -- data breakpoints on a chip's elements ---------------------------------------------------------------
    def watches(self, value: str) -> bool:
        """Does the chip record the writes of `value` element by element (a kernel's tensor, `out_ptr[3]`; an index
        that names no element of one too: its breakpoint says why it is not verified)?"""
        writes = getattr(self.driver, "element_writes", None)
        if writes is None:
            return False
        try:
            return any(writes(n.index, value) is not None for n in self.tl.program.nodes)
        except RewindError:
            return True

    def set_element_breakpoints(self, specs: Iterable) -> list[Breakpoint]:
        """Replace the element data breakpoints (DataSpecs whose value `watches` says the chip records)."""
        out = []
        for spec in specs:
            bp = ElementBreakpoint(self.table.next_id(), "data", spec.value, spec.condition, spec.hit_condition)
            self.table.validate(bp)
            if bp.condition:
                bp.verified, bp.message = False, "a data breakpoint on a kernel's elements takes a hit condition only"
            try:
                for node in self.tl.program.nodes:
                    self.driver.element_writes(node.index, bp.spec)
            except RewindError as exc:
                bp.verified, bp.message = False, str(exc)
            out.append(bp)
        self.element_bps = out
        return out

    def locate_elements(self, name: str) -> dict | None:
        """`locate` of a tensor of the chip's own code or one element of it (`out_ptr[37]`), on a chip that records
        its accesses element by element (a kernel's): where it lives and what the units did to it before the
        position (in the node at or before it); None when `name` names none."""
        found = getattr(self.driver, "locate_elements", None)
        if found is None:
            return None
        tl = self.tl
        ticks = tl.node_tick
        node = max((i for i, t in enumerate(ticks) if t <= tl.position), key=lambda i: ticks[i], default=0)
        tick = ticks[node]
        self._ensure_run(tick)
        steps = self.step if tick == tl.position else (None if tick < tl.position else 0)
        return found(node, name, steps)

    def _element_hits(self, node: int) -> dict[int, list[tuple[ElementBreakpoint, str]]]:
        """Positions right after a step that writes a watched element, by the breakpoints whose hit it is."""
        hits: dict[int, list[tuple[ElementBreakpoint, str]]] = {}
        for bp in self.element_bps:
            if not bp.verified:
                continue
            for count, (step, what) in enumerate(self.driver.element_writes(node, bp.spec) or (), 1):
                if bp.accepts_hits(count):
                    hits.setdefault(step + 1, []).append((bp, what))
        return hits

    def _code_line_bps(self) -> list[CodeLineBreakpoint]:
        return [bp for bps in self.code_lines.values() for bp in bps if bp.verified and bp.log_message is None]

    def _code_line_hits(self, tick: Tick, sched: NodeSchedule) -> dict[int, list[CodeLineBreakpoint]]:
        """Positions where a unit begins executing a breakpoint's line, whose condition holds and whose hit
        condition accepts the hit (counted in the node's steps)."""
        hits: dict[int, list[CodeLineBreakpoint]] = {}
        for bp in self._code_line_bps():
            count = 0
            for k in range(len(sched)):
                if (int(sched.units[k]), int(sched.pcs[k])) not in bp.at:
                    continue
                if bp.condition and not self._code_condition(bp, tick, k, int(sched.units[k])):
                    continue
                count += 1
                if bp.accepts_hits(count):
                    hits.setdefault(k, []).append(bp)
        return hits

    def _code_condition(self, bp: CodeLineBreakpoint, tick: Tick, k: int, unit: int) -> bool:
        key = (tick, k)
        if key not in bp._cond_cache:
            names = self.chip(tick, k).locals(unit)
            try:
                bp._cond_cache[key] = truth(evaluate(bp.condition, names))
            except ExpressionError as exc:
                self.state.on_event(Output(f"breakpoint {bp.id} condition failed at step {k}: {exc}\n", "error"))
                bp._cond_cache[key] = True  # an unevaluable condition stops, so the user sees why
        return bp._cond_cache[key]

    def set_breakpoints(self, specs: Iterable[InstructionSpec]) -> list[Breakpoint]:
        out = []
        for spec in specs:
            bp = InstructionBreakpoint(self.table.next_id(), "instruction", str(spec.reference), None,
                                       spec.hit_condition)
            self.table.validate(bp)
            self._bind(bp, spec)
            out.append(bp)
        self.breakpoints = out
        return out

    def _bind(self, bp: InstructionBreakpoint, spec: InstructionSpec) -> None:
        ref = spec.reference
        if spec.condition:
            bp.verified, bp.message = False, "instruction breakpoints take a hit condition, not a condition"
            return
        try:
            address = int(str(ref), 0) + int(spec.offset or 0)
        except ValueError:
            bp.verified, bp.message = False, f"'{ref}' is not an instruction address (use one from disassemble)"
            return
        where = self.driver.instruction_at(address)
        if where is None:
            bp.verified, bp.message = False, f"no instruction at {address:#x}"
            return
        bp.node, bp.unit, bp.pc = where
        bp.spec = f"{address:#x}"
        node = self.tl.program.nodes[bp.node]
        bp.file, bp.line = (node.loc.file, node.loc.line) if node.loc else (None, None)

    # -- findings ----------------------------------------------------------------------------------
    def _instruction(self, node: "Node", unit: int, pc: int) -> dict:
        infos = {i.pc: i for i in self.driver.disassemble(node.index, unit)}
        info = infos.get(pc)
        name = self.tl.unit_name(unit)
        return {"unit": name, "pc": pc, "address": f"{info.address:#x}" if info else None,
                "instruction": info.text if info else "?", "line": info.line if info else None}

    def _race_stop(self, tick: Tick, node: "Node", race: RaceReport) -> Stop:
        first = self._instruction(node, race.first_unit, race.first_pc) | {"step": race.first_step}
        second = self._instruction(node, race.second_unit, race.second_pc) | {"step": race.second_step}
        span = f"[{race.address:#x}, {race.address + race.nbytes:#x})"
        at = [f" at line {side['line']}" if side["line"] is not None else "" for side in (first, second)]
        message = (f"race on '{race.tensor}' {span} in {race.space} ({race.kind}): {first['unit']} "
                   f"`{first['instruction'].split()[0]}`{at[0]} at step {race.first_step} and {second['unit']} "
                   f"`{second['instruction'].split()[0]}`{at[1]} at step {race.second_step} are not ordered by any "
                   f"barrier, semaphore or DMA wait, in node '{node.name}'" + (f" at {node.loc}" if node.loc else ""))
        detail = {"node": node.name, "tensor": race.tensor, "space": race.space, "kind": race.kind,
                  "addresses": [f"{race.address:#x}", f"{race.address + race.nbytes:#x}"],
                  "units": [first["unit"], second["unit"]], "instructions": [first, second]}
        return self._exception(tick, node, "race", message, detail, race.tensor, race.nbytes, race.second_unit)

    def _hang_stop(self, tick: Tick, node: "Node", sched: NodeSchedule) -> Stop:
        hang = sched.hang
        name = self.tl.unit_name
        graph = [{"unit": name(w.unit), "waitsOn": w.what, "since": w.since, "detail": w.detail,
                  "waitingFor": [name(u) for u in w.waiting_for]} for w in hang.waits]
        shown = "; ".join(f"{g['unit']} {g['detail']} (since step {g['since']})" for g in graph[:4])
        more = f"; and {len(graph) - 4} more" if len(graph) > 4 else ""
        message = (f"hang in node '{node.name}'" + (f" at {node.loc}" if node.loc else "") +
                   f": every live unit is blocked after step {hang.step}: {shown}{more}")
        detail = {"node": node.name, "step": hang.step, "lastProgress": hang.step - 1, "waitFor": graph}
        first = hang.waits[0].unit if hang.waits else None
        return self._exception(tick, node, "hang", message, detail, node.outputs[0], len(graph), first)

    def _exception(self, tick: Tick, node: "Node", filt: str, message: str, detail: dict, value: str, count: int,
                   unit: int | None) -> Stop:
        details = ExceptionDetails(filt, node.name, node.op, str(node.loc) if node.loc else None, value, count, None,
                                   {}, evidence=detail | {"message": message})
        return Stop("exception", tick, message, exception=details, unit=unit)

    # -- inspection -----------------------------------------------------------------------------------
    def disassemble(self, unit: int, tick: Tick | None = None) -> list[dict]:
        """A unit's instruction stream in the node at `tick` (default: the current one), with source lines."""
        tl = self.tl
        tick = min(tl.position, tl.end - 1) if tick is None else tick
        node = tl.node_at(tick)
        if node is None:
            raise RewindError(f"tick {tick} runs no node")
        if not 0 < unit < len(tl.unit_names):
            raise RewindError(f"no unit {unit}: the chip's units are 1..{len(tl.unit_names) - 1}")
        current = self._pc(unit) if tick == tl.position else None
        source = {"file": node.loc.file, "line": node.loc.line} if node.loc else None
        return [{"address": f"{i.address:#x}", "instruction": i.text, "pc": i.pc, "node": node.name,
                 "tick": tick, "source": {"file": i.file, "line": i.line} if i.line is not None else source,
                 "current": i.pc == current}
                for i in self.driver.disassemble(node.index, unit)]

    def _pc(self, unit: int) -> int | None:
        tl = self.tl
        if tl.position >= tl.end or tl.node_at(tl.position) is None:
            return None
        return next((u.pc for u in self.chip().units() if u.unit == unit), None)

    def unit_frame(self, unit: int, node_frames: list[FrameInfo]) -> list[FrameInfo]:
        """A unit's stack: the node's frames, the innermost one at the unit's next instruction (so frame
        levels, and with them scopes and evaluation, are the same on every unit's stack)."""
        tl = self.tl
        node = tl.node_at(tl.position) if tl.position < tl.end else None
        if unit == 0 or node is None:
            return node_frames
        state = next(u for u in self.chip().units() if u.unit == unit)
        name = tl.unit_name(unit)
        what = f"{name}: {state.status}" if state.pc is None else f"{name} pc {state.pc}: {state.detail}"
        infos = self.driver.disassemble(node.index, unit)
        info = next((i for i in infos if i.pc == state.pc), None)
        top = node_frames[0]
        at = info or (infos[-1] if infos and state.pc is None else None)  # a halted unit: at its last line
        file, line = (at.file, at.line) if at is not None and at.line is not None else (top.file, top.line)
        return [FrameInfo(top.id, f"{what} — {top.name}", file, line, top.module_path,
                          instruction_pointer=info.address if info else None)] + node_frames[1:]

    # -- memory by physical address ------------------------------------------------------------------
    def read(self, address: int, count: int) -> bytes:
        out = bytearray()
        end = address + count
        while address < end:
            chunk = self._read_region(address, end - address)
            out += chunk
            address += len(chunk)
        return bytes(out)

    def _read_region(self, address: int, count: int) -> bytes:
        tl = self.tl
        tick = tl.position
        node = tl.node_at(tick) if tick < tl.end else None
        region = self.driver.region(address, node.index if node else None)
        if region is None:
            raise RewindError(f"no memory is mapped at {address:#x}")
        count = max(1, min(count, region.start + region.nbytes - address))
        inside = node is not None and self.step > 0 and self.chip().touches(address)
        if inside:
            return self.chip().read(address, count)
        if region.value is not None and tl.version_at(region.value, tick) is not None:
            return tl.driver.read(tl.value(region.value, tick), address - region.start, count)
        return self.driver.memory_before(node.index if node else len(tl.program.nodes), address, count)

    def write(self, address: int, data: bytes) -> int:
        """A write into chip memory at the position: a value edit at a node boundary, else an edit of the
        node's run (applied before the current step when it replays). Returns the tick."""
        tl = self.tl
        tick = tl.position
        node = tl.node_at(tick) if tick < tl.end else None
        region = self.driver.region(address, node.index if node else None)
        if region is None or address + len(data) > region.start + region.nbytes:
            raise RewindError(f"a write of {len(data)} bytes at {address:#x} must lie inside one buffer"
                              + (f" ({region.label}: {region.start:#x}+{region.nbytes})" if region else ""))
        k = self.step
        if region.value is not None and k == 0 and tl.version_at(region.value, tick) is not None:
            return self._write_value(region.value, address - region.start, data)
        if node is None or not self.chip().touches(address):
            raise RewindError(f"{address:#x} ({region.label or region.space}) is not memory the node at tick {tick} "
                              "uses: writing it would change nothing")
        sched = self.schedule(tick)
        edits = self.driver.edits(node.index) + [(k, address, bytes(data))]
        tl.forget_from(tick)
        self.driver.rewrite(node.index, [int(u) for u in sched.units[:k]], edits)
        self._ensure_run(tick)
        self.place(tick, k)
        return tick

    def placement(self, value: str) -> list:
        tl = self.tl
        if self.step == 0 or tl.node_at(tl.position) is None:
            return []
        return self.chip().placement(value)


def _hits(bp: InstructionBreakpoint, sched: NodeSchedule) -> list[int]:
    """Steps that execute the breakpoint's instruction (an instruction belongs to one node, which runs once:
    its hits are counted within that node)."""
    steps = np.flatnonzero((sched.units == bp.unit) & (sched.pcs == bp.pc))
    return [int(s) for i, s in enumerate(steps) if bp.accepts_hits(i + 1)]


def _every(tick: Tick, sched: NodeSchedule | None) -> np.ndarray:
    return np.arange(1 if sched is None else sched.positions + 1)


def _at(stop: Stop, tick: Tick) -> Stop:
    stop.tick = tick
    return stop
