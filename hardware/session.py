"""The Session: the one Python API every surface (DAP, console, LSP, tests) drives.

It owns the driver, the Program, the Timeline and the breakpoints. Every method except
`pause()` runs on the caller's (the adapter's single worker) thread and blocks. The
Session knows nothing of DAP: it reports what happens as domain events (stopped, output,
progress, invalidated) through `on_event`.

Positions: position p means p steps have run and the node of step p is about to run, as a
debugger stops before a line executes. Position `end` is the end of the program, where the
session stays (stopped, reason "end") so the user can go back.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from checkpoint import recording
from checkpoint.tiers import DiskTier, HostTier
from checkpoint.timeline import Tick, Timeline
from hardware.address_map import occupant
from hardware.breakpoints import (Breakpoint, check_breakpoint_expressions, function_positions, line_positions,
                                  resolve_line)
from hardware.driver import open_driver
from hardware.errors import ExpressionError, NotStoppedError, RewindError
from hardware.expressions import evaluate, truth
from hardware.instructions import InstructionDriver
from hardware.memory import Placement
from hardware.program import Frame, Node, Program
from hardware.source_names import Assignment, assignments, frame_instance
from provenance.lineage import lineage
from provenance.writelog import WriteRecord


class Direction(Enum):
    FORWARD = "forward"
    REVERSE = "reverse"


@dataclass
class ExceptionDetails:
    filter: str  # "nan", "inf", "divergence"
    node: str
    op: str
    source: str | None
    value: str
    count: int  # bad elements: NaN, Inf, or (divergence) elements beyond tolerance of the reference
    first_index: tuple[int, ...] | None
    inputs: dict[str, dict]  # input name -> stats
    evidence: dict = field(default_factory=dict)  # forensics: failure pattern, errors against the reference

    def description(self) -> str:
        where = f" at {self.source}" if self.source else ""
        if self.filter in ("race", "hang"):  # parallel findings of a many-core chip (hardware/instruction_cursor.py)
            return self.evidence["message"]
        if self.filter == "divergence":
            return (f"'{self.value}' diverges from the reference at {self.count} element(s): "
                    f"{self.op} ('{self.node}'){where} introduced the error")
        what = "NaN" if self.filter == "nan" else "Inf"
        return f"{self.count} {what} written to '{self.value}' by {self.op} ('{self.node}')" + where


@dataclass
class Stop:
    reason: str  # entry, step, breakpoint, function breakpoint, data breakpoint, exception, pause, goto, end
    tick: int
    description: str = ""
    breakpoint_ids: list[int] = field(default_factory=list)
    exception: ExceptionDetails | None = None
    instruction: int | None = None  # steps of the node at `tick` that have run (instruction granularity)
    unit: int | None = None  # the unit the stop is about (a race's second access, a hung unit)


@dataclass
class SessionEvent:
    kind: str  # "stopped", "output", "progress", "invalidated", "nondeterminism"
    body: dict


@dataclass
class LaunchOptions:
    program: str = ""
    entry: str = "build"
    driver: str = "auto"
    budget_mb: float = 1024.0  # the device tier of the checkpoint ring
    every: int | None = None
    stop_on_entry: bool = False
    host_mb: float = 0.0  # host tier (lz4) the ring spills into; 0: none
    disk_mb: float = 0.0  # disk tier below the host tier; 0: none
    spill_dir: str | None = None
    check_batch: int | None = None  # writes whose on-device checks are read back together; None: the driver's
    device_pool: bool | None = None  # copy checkpoints into a preallocated device pool; None: on a GPU
    record: str | None = None  # record continuously to this trace file
    trace: str | None = None  # open this trace instead of running a program
    reference: str | None = None  # forensics: torch:cpu:float64 (the default), a trace, or saved values
    rtol: float | None = None  # tolerances against the reference; None: the dtype's default
    atol: float | None = None
    seed: int = 0  # sim chip: the seed of a random schedule
    schedule: str = "round-robin"  # sim chip: how units' steps interleave (round-robin, random)
    faults: list = field(default_factory=list)  # sim chip: injected faults (hardware/drivers/sim/faults.py)

    def driver_options(self) -> dict:
        """The options the driver itself takes (only those set away from their defaults)."""
        chosen = {"seed": self.seed, "schedule": self.schedule, "faults": self.faults}
        defaults = {"seed": 0, "schedule": "round-robin", "faults": []}
        return {k: v for k, v in chosen.items() if v != defaults[k]}


@dataclass
class FrameInfo:
    id: int  # 0 = innermost
    name: str
    file: str | None
    line: int | None
    module_path: str | None
    instruction_pointer: int | None = None  # code address of the unit's next instruction


class Session:
    """Hardware session manager: launch, move in both directions, inspect, edit."""

    def __init__(self, on_event: Callable[[SessionEvent], None] | None = None):
        self.on_event = on_event or (lambda e: None)
        self.timeline: Timeline | None = None
        self.program: Program | None = None
        self.options: LaunchOptions | None = None
        self.line_breakpoints: dict[str, list[Breakpoint]] = {}
        self.function_breakpoints: list[Breakpoint] = []
        self.data_breakpoints: list[Breakpoint] = []
        self.exception_filters: set[str] = set()
        self.last_stop: Stop | None = None
        self._next_bp_id = 1
        self._pause = threading.Event()
        self._deferred: list[int] = []  # exception checks waiting for their ticks' on-device checks
        self._positions_cache: dict[int, tuple] = {}
        self._forensics = None
        self._experiments = None
        self._instructions = None  # InstructionCursor, on a driver whose nodes run as instruction streams

    # -- lifecycle -----------------------------------------------------------------------------
    def launch(self, options: LaunchOptions, program: Program | None = None) -> None:
        """Load the user's program (export it unless given) onto the driver; position 0.

        With `options.trace`, open that trace instead (no device needed); with `options.record`,
        record every step to a trace file as it runs."""
        from hardware.frontends.torch_export import load_program

        self.close()  # a relaunch (restart with new arguments) finishes the previous run's recording
        self.options = options
        if options.trace:
            recompute = open_driver(options.driver) if options.driver != "auto" else None
            self.program, self.timeline, reader = recording.open_trace(options.trace, self._make_timeline, recompute)
            self.trace_reader = reader
            for warning in reader.contents.warnings:
                self.on_event(SessionEvent("output", {"category": "important", "text": warning + "\n"}))
        else:
            driver = open_driver(options.driver, options.driver_options())
            driver.on_report = lambda text: self.on_event(SessionEvent("output", {"category": "important",
                                                                                   "text": text + "\n"}))
            self.program = program or load_program(options.program, options.entry)
            self.timeline = self._make_timeline(self.program, driver, None)
            if options.record:
                recording.record(self.timeline, options.record)
        kept = self._instructions.breakpoints if self._instructions is not None else []
        self._instructions = None
        if isinstance(self.timeline.driver, InstructionDriver):
            from hardware.instruction_cursor import InstructionCursor

            self._instructions = InstructionCursor(self, kept)
        self._assignments: list[Assignment] = assignments(self.program)
        for bps in self.line_breakpoints.values():
            for bp in bps:
                self._bind_line(bp)

    def _make_timeline(self, program: Program, driver, archive) -> Timeline:
        o = self.options
        tiers = None
        if o.host_mb > 0 or o.disk_mb > 0:
            disk = DiskTier(int(o.disk_mb * 2**20), o.spill_dir) if o.disk_mb > 0 else None
            tiers = HostTier(int(o.host_mb * 2**20), disk)
        return Timeline(program, driver, budget=int(o.budget_mb * 2**20), every=o.every,
                        on_nondeterminism=self._report_nondeterminism, tiers=tiers, archive=archive,
                        check_batch=o.check_batch, device_pool=o.device_pool)

    def save_trace(self, path: str) -> dict:
        """Write the whole recorded run to `path` (values evicted from the ring are recomputed)."""
        tl = self.tl
        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            if time.monotonic() - started > 0.5:
                self.on_event(SessionEvent("progress", {"message": f"saving tick {done} of {total}",
                                                        "percentage": 100.0 * done / max(total, 1)}))
        writer = recording.save(tl, path, progress)
        return {"path": str(writer.path), "bytes": writer.size, "ticks": tl.frontier, "rawBytes": writer.bytes_raw}

    def close(self) -> None:
        """End the session: finish a recording (index and footer) and free spill files."""
        tl = self.timeline
        if tl is None:
            return
        if tl.recorder is not None:
            tl.recorder.close()
        if tl.tiers is not None:
            tl.tiers.close()
        reader = getattr(self, "trace_reader", None)
        if reader is not None:
            reader.close()
            self.trace_reader = None

    def _report_nondeterminism(self, finding) -> None:
        self.on_event(SessionEvent("output", {"category": "important", "text": str(finding) + "\n"}))
        self.on_event(SessionEvent("nondeterminism", {"tick": finding.tick, "node": finding.node,
                                                      "value": finding.value}))

    @property
    def tl(self) -> Timeline:
        if self.timeline is None:
            raise NotStoppedError("no program is loaded: launch first")
        return self.timeline

    @property
    def position(self) -> Tick:
        return Tick(self.tl.position)

    @property
    def end(self) -> Tick:
        return Tick(self.tl.end)

    def start(self) -> Stop:
        """After configuration: stop at entry, or run to the first stop."""
        if self.options and self.options.stop_on_entry:
            return self._stopped(Stop("entry", self.tl.position, "stopped on entry"))
        return self.run(Direction.FORWARD)

    def pause(self) -> None:
        """Thread-safe: ask the running motion, or the one about to start, to stop at its next tick.

        The request is consumed by the next stop, so a pause that races the start of a motion still stops it."""
        self._pause.set()

    # -- moving ----------------------------------------------------------------------------------
    def run(self, direction: Direction = Direction.FORWARD) -> Stop:
        """Continue (or reverse-continue) to the next position where a breakpoint holds."""
        return self._scan(direction, lambda q: None, breakpoints=True)

    def step(self, direction: Direction = Direction.FORWARD, granularity: str = "line",
             kind: str = "over", unit: int | None = None, single_thread: bool = False) -> Stop:
        """One step: kind over (next), in (stepIn), out (stepOut); granularity statement, line, instruction.

        Breakpoints met on the way stop the step early, as in gdb. On a chip whose nodes run as
        instruction streams, granularity `instruction` is one step of the node's interleaving: of any
        unit, of `unit` (the others run as recorded), or of `unit` alone (`single_thread`)."""
        tl = self.tl
        start = tl.position
        if self._instructions is not None:
            if granularity == "instruction":
                return self._instructions.step_instruction(direction, unit, single_thread)
            if direction is Direction.REVERSE and self.instruction:  # back to the start of the node we are inside
                return self._scan(direction, lambda q: Stop("step", q) if q == start else None, breakpoints=True)
        if granularity in ("statement", "instruction") and kind != "out":
            target = start + (1 if direction is Direction.FORWARD else -1)
            return self._scan(direction, lambda q: Stop("step", q) if q == target else None)
        frames = self._frames_at(start if start < tl.end else tl.end - 1)
        if kind == "out":
            return self._step_out(direction, frames)
        if direction is Direction.REVERSE:
            return self._step_back_line(frames)
        depth = len(frames)

        def done(q: int) -> Stop | None:
            g = self._frames_at(q) if q < tl.end else ()
            if kind == "in" or depth == 0:  # depth 0: from a user edit, which is a step of its own
                return Stop("step", q) if kind != "in" or _keys(g) != _keys(frames) else None
            if not _same_frame(frames, g, depth) or g[depth - 1].loc.line != frames[depth - 1].loc.line:
                return Stop("step", q)
            return None

        return self._scan(direction, done, breakpoints=True)

    def _step_out(self, direction: Direction, frames: tuple[Frame, ...]) -> Stop:
        depth = len(frames)
        tl = self.tl
        if direction is Direction.FORWARD:
            def left(q: int) -> Stop | None:
                g = self._frames_at(q) if q < tl.end else ()
                return Stop("step", q) if depth == 0 or not _same_frame(frames, g, depth) else None
            return self._scan(direction, left, breakpoints=True)
        # Backwards: to the instant before the current frame was entered.
        q = min(tl.position, tl.end - 1)
        while q > 0 and depth and _same_frame(frames, self._frames_at(q - 1), depth):
            q -= 1
        target = q if q < tl.position else max(q - 1, 0)
        return self._scan(direction, lambda p: Stop("step", p) if p == target else None, breakpoints=True)

    def _step_back_line(self, frames: tuple[Frame, ...]) -> Stop:
        tl = self.tl
        depth = len(frames)
        q = tl.position - 1
        if tl.position < tl.end and depth:  # skip the earlier nodes of the current line (an edit has none)
            while q >= 0 and _in_line(frames, self._frames_at(q), depth):
                q -= 1
        if q < 0:
            return self._scan(Direction.REVERSE, lambda p: Stop("step", p) if p == 0 else None)
        anchor = self._frames_at(q)
        if not anchor:  # a user edit has no source line: stepping back undoes just it
            return self._scan(Direction.REVERSE, lambda p: Stop("step", p) if p == q else None, breakpoints=True)
        level = min(depth, len(anchor)) if tl.position < tl.end else len(anchor)
        while q > 0 and _in_line(anchor, self._frames_at(q - 1), level):
            q -= 1
        target = q
        return self._scan(Direction.REVERSE, lambda p: Stop("step", p) if p == target else None, breakpoints=True)

    def goto(self, tick: int) -> Stop:
        tl = self.tl
        if not 0 <= tick <= tl.end:
            raise RewindError(f"tick {tick} is outside the program (0..{tl.end})")
        tl.seek(tick)
        self.on_event(SessionEvent("invalidated", {"areas": ["variables", "stacks"]}))
        return self._stopped(self._end_or(Stop("goto", tick, f"tick {tick}")))

    def restore(self, tick: int) -> Stop:
        """Restore a checkpoint: go to its tick, where its values are retained."""
        if tick not in {c.tick for c in self.tl.checkpoints()}:
            raise RewindError(f"no checkpoint at tick {tick}; checkpoints: {[c.tick for c in self.tl.checkpoints()]}")
        return self.goto(tick)

    def restart(self) -> Stop:
        self.tl.seek(0)
        return self.start()

    def _scan(self, direction: Direction, stop_at: Callable[[int], Stop | None], breakpoints: bool = False) -> Stop:
        """Move position by position until `stop_at` (or a breakpoint, when asked) says stop."""
        tl = self.tl
        q = tl.position
        began = time.monotonic()
        step = 1 if direction is Direction.FORWARD else -1
        inside = self.instruction  # steps run of the node at q, when stopped inside it
        if step < 0 and inside:
            q += 1  # going back crosses the rest of the node at q first
        first = True
        self._deferred = []  # ticks passed whose checks were still on the device
        while True:
            if step > 0 and q >= tl.end:
                stop = self._late_exception(settle=True) or Stop("end", tl.end, "end of program")
                tl.seek(stop.tick)
                return self._stopped(stop)
            if step < 0 and q <= 0:
                tl.seek(0)
                return self._stopped(Stop("entry", 0, "beginning of the program"))
            if breakpoints and self._instructions is not None:  # stops inside the node this move crosses
                lo, hi = (inside if first else -1, None) if step > 0 else (-1, inside if first and inside else None)
                crossed = self._instructions.crossing(q if step > 0 else q - 1, lo, hi, direction)
                if crossed is not None:
                    tl.seek(crossed.tick)
                    return self._stopped(crossed)
            first = False
            q += step
            if step > 0 and q > tl.frontier:
                tl.seek(q)  # executes the step and records it
            stop = stop_at(q)
            if stop is None and breakpoints:
                stop = self._breakpoint_stop(q, direction)
            if stop is None and self._pause.is_set():
                stop = Stop("pause", q, "paused")
            late = self._late_exception(settle=stop is not None)
            if late is not None and (stop is None or late.tick < stop.tick):
                stop, q = late, late.tick
            if stop is not None:
                tl.seek(q)
                return self._stopped(self._end_or(stop))
            if time.monotonic() - began > 0.5 and (q % 64 == 0):
                self.on_event(SessionEvent("progress", {"message": f"tick {q} of {tl.end}",
                                                        "percentage": 100.0 * q / max(tl.end, 1)}))

    def _end_or(self, stop: Stop) -> Stop:
        if stop.tick == self.tl.end and stop.reason in ("step", "goto"):
            return Stop("end", stop.tick, "end of program")
        return stop

    def _stopped(self, stop: Stop) -> Stop:
        self._pause.clear()
        self.last_stop = stop
        body = {"reason": stop.reason, "tick": stop.tick, "description": stop.description,
                "hitBreakpointIds": stop.breakpoint_ids}
        if self._instructions is not None:
            self._instructions.place(stop.tick, stop.instruction or 0)
            body.update(instruction=stop.instruction or 0, unit=stop.unit)
        self.on_event(SessionEvent("stopped", body))
        return stop

    # -- breakpoints -------------------------------------------------------------------------------
    def set_line_breakpoints(self, file: str, specs: Iterable[Mapping[str, Any]]) -> list[Breakpoint]:
        """Replace the breakpoints of `file`. Each spec: line, condition?, hitCondition?, logMessage?."""
        path = str(Path(file).resolve()) if file else file
        result = []
        for spec in specs:
            bp = Breakpoint(self._next_bp_id, "line", f"{path}:{spec['line']}", spec.get("condition"),
                            spec.get("hitCondition"), spec.get("logMessage"), file=path, line=int(spec["line"]))
            self._next_bp_id += 1
            self._validate(bp)
            if bp.verified and self.program is not None:
                self._bind_line(bp)
            result.append(bp)
        self.line_breakpoints[path] = result
        return result

    def _bind_line(self, bp: Breakpoint) -> None:
        line, why = resolve_line(self.program, bp.file, bp.line)
        if line is None:
            bp.verified, bp.message = False, why
        else:
            bp.line, bp.verified, bp.message = line, bp.verified, bp.message

    def set_function_breakpoints(self, specs: Iterable[Mapping[str, Any]]) -> list[Breakpoint]:
        result = []
        for spec in specs:
            name = spec["name"]
            bp = Breakpoint(self._next_bp_id, "function", name, spec.get("condition"), spec.get("hitCondition"))
            self._next_bp_id += 1
            self._validate(bp)
            if bp.verified and self.program is not None and not self.program.find_nodes(name):
                bp.verified, bp.message = False, (f"no node, op or module path '{name}' in the program "
                                                  "(try a node name, an op like aten.softmax, or blocks.0.attn)")
            result.append(bp)
        self.function_breakpoints = result
        return result

    def set_data_breakpoints(self, specs: Iterable[Mapping[str, Any]]) -> list[Breakpoint]:
        result = []
        for spec in specs:
            value = spec["dataId"]
            bp = Breakpoint(self._next_bp_id, "data", value, spec.get("condition"), spec.get("hitCondition"))
            self._next_bp_id += 1
            self._validate(bp)
            if bp.verified and (self.program is None or value not in self.program.values):
                bp.verified, bp.message = False, f"no value named '{value}' in the program"
            result.append(bp)
        self.data_breakpoints = result
        return result

    def set_exception_filters(self, filters: Iterable[str]) -> None:
        """nan, inf: stop after the step that wrote a NaN / Inf its inputs did not carry; divergence: stop
        after the step where the pass first leaves its reference (see provenance/forensics.py)."""
        unknown = set(filters) - {"nan", "inf", "divergence", "race", "hang"}
        if unknown:
            raise RewindError(f"unknown exception filter(s): {', '.join(sorted(unknown))} "
                              "(known: nan, inf, divergence, race, hang)")
        self.exception_filters = set(filters)

    def _validate(self, bp: Breakpoint) -> None:
        try:
            check_breakpoint_expressions(bp.condition, bp.hit_condition, bp.log_message)
        except ExpressionError as exc:
            bp.verified, bp.message = False, str(exc)

    def _all_breakpoints(self) -> list[Breakpoint]:
        out = [bp for bps in self.line_breakpoints.values() for bp in bps]
        return [bp for bp in out + self.function_breakpoints + self.data_breakpoints if bp.verified]

    def _static_positions(self, bp: Breakpoint) -> tuple[list[int], frozenset[int]]:
        """Positions where the breakpoint's static part matches (cached until the schedule changes)."""
        tl = self.tl
        key = (bp.id, tl.end, len(tl.log) if bp.kind == "data" else 0, id(tl))
        cached = self._positions_cache.get(bp.id)
        if cached is not None and cached[0] == key:
            return cached[1]
        if bp.kind == "line":
            found = line_positions(self.program, tl.node_at, tl.end, bp.file, bp.line)
        elif bp.kind == "function":
            found = function_positions(self.program, tl.node_at, tl.end, bp.spec)
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
                bp._cond_cache[q] = truth(evaluate(bp.condition, self.names_at(q)))
            except ExpressionError as exc:
                self.on_event(SessionEvent("output", {"category": "stderr",
                                                      "text": f"breakpoint {bp.id} condition failed at tick {q}: {exc}\n"}))
                bp._cond_cache[q] = True  # an unevaluable condition stops, so the user sees why
        return bp._cond_cache[q]

    def _breakpoint_stop(self, q: int, direction: Direction) -> Stop | None:
        hit: list[Breakpoint] = []
        for bp in self._all_breakpoints():
            if self._holds(bp, q, self._static_positions(bp)):
                if bp.log_message is not None:
                    if direction is Direction.FORWARD:
                        self.on_event(SessionEvent("output", {"category": "console",
                                                              "text": self._interpolate(bp.log_message, q) + "\n"}))
                    continue
                hit.append(bp)
        if hit:
            kinds = {bp.kind for bp in hit}
            reason = "data breakpoint" if kinds == {"data"} else (
                "function breakpoint" if kinds == {"function"} else "breakpoint")
            return Stop(reason, q, ", ".join(_describe_bp(bp) for bp in hit), [bp.id for bp in hit])
        if self.exception_filters and q > 0 and not self._defer(q - 1, direction):
            details = self._exception_at(q - 1)
            if details is not None:
                return Stop("exception", q, details.description(), exception=details)
        return None

    def _defer(self, tick: int, direction: Direction) -> bool:
        """Must the exception check of `tick` wait for its on-device checks, still on their way (going forward)?"""
        checks = self.tl.checks
        if direction is Direction.FORWARD and checks is not None and checks.waiting(tick):
            self._deferred.append(tick)
            return True
        return False

    def _late_exception(self, settle: bool) -> Stop | None:
        """The first deferred tick whose checks have landed (all have, when `settle`) and show an exception: the
        scan stops after the tick that set the flag, however many ticks later it came back."""
        if not self._deferred:
            return None
        checks = self.tl.checks
        if settle:
            checks.settle()
        else:
            checks.poll()
        while self._deferred and not checks.waiting(self._deferred[0]):
            details = self._exception_at(tick := self._deferred.pop(0))
            if details is not None:
                self._deferred.clear()
                return Stop("exception", tick + 1, details.description(), exception=details)
        return None

    def _exception_at(self, tick: int) -> ExceptionDetails | None:
        details = self.nonfinite_at(tick, self.exception_filters)
        if details is not None:
            details.evidence = self.forensics.explain(details, tick)
            return details
        if "divergence" in self.exception_filters:
            found = self.forensics.divergence_at(tick)
            if found is not None:
                found.details.evidence = found.to_dict()
                return found.details
        return None

    @property
    def forensics(self):
        """Numerical forensics of this pass against its reference (provenance/forensics.py)."""
        from provenance.forensics import Forensics

        if self._forensics is None or self._forensics.timeline is not self.tl:
            self._forensics = Forensics(self)
        return self._forensics

    @property
    def experiments(self):
        """Named branches of patches on this pass, measured and undone (provenance/experiments.py)."""
        from provenance.experiments import Experiments

        if self._experiments is None or self._experiments.timeline is not self.tl:
            self._experiments = Experiments(self)
        return self._experiments

    def _interpolate(self, message: str, q: int) -> str:
        import re

        def sub(m):
            try:
                return _short(evaluate(m[1], self.names_at(q)))
            except ExpressionError as exc:
                return f"<{exc}>"
        return re.sub(r"\{([^{}]+)\}", sub, message)

    def nonfinite_at(self, tick: int, filters: Iterable[str] = ("nan", "inf")) -> ExceptionDetails | None:
        """Did step `tick` produce a NaN/Inf of a kind in `filters` (one its inputs did not carry)?"""
        tl = self.tl
        for rec in tl.log.at_tick(tick):
            for filt, count in (("nan", rec.stats.nan), ("inf", rec.stats.inf)):
                if filt in filters and count and not self._inputs_carry(tick, filt):
                    return self._exception_details(rec, filt, count)
        return None

    def _inputs_carry(self, tick: int, filt: str) -> bool:
        node = self.tl.node_at(tick)
        names = node.input_names() if node else [self.tl.step_at(tick).edit.value]
        for name in names:
            s = self.value_stats(name, tick)
            if (s["nan"] if filt == "nan" else s["inf"]):
                return True
        return False

    def _exception_details(self, rec: WriteRecord, filt: str, count: int) -> ExceptionDetails:
        tensor = self.tl.value(rec.value, rec.tick + 1)
        mask = torch.isnan(tensor) if filt == "nan" else torch.isinf(tensor)
        idx = mask.nonzero()
        first = tuple(int(i) for i in idx[0]) if len(idx) else None
        node = self.tl.node_at(rec.tick)
        inputs = {n: self.value_stats(n, rec.tick) for n in (node.input_names() if node else [])}
        return ExceptionDetails(filt, rec.node_name or "edit", rec.op or "edit", str(rec.loc) if rec.loc else None,
                                rec.value, count, first, inputs)

    def exception_info(self) -> ExceptionDetails:
        if self.last_stop is None or self.last_stop.exception is None:
            raise RewindError("not stopped on an exception")
        return self.last_stop.exception

    # -- inspection -------------------------------------------------------------------------------------
    def current_node(self) -> Node | None:
        return self.tl.node_at(self.tl.position)

    def _frames_at(self, tick: int) -> tuple[Frame, ...]:
        node = self.tl.node_at(tick)
        return node.frames if node else ()

    def frames(self, unit: int | None = None) -> list[FrameInfo]:
        """The node at its source line, then the enclosing module forward frames, innermost first; for a
        unit of a many-core chip, its next instruction first."""
        if unit and self._instructions is not None:
            return self._instructions.unit_frame(unit, self.frames())
        tl = self.tl
        tick = tl.position if tl.position < tl.end else tl.end - 1
        node = tl.node_at(tick)
        if node is None:
            step = tl.step_at(tick)
            return [FrameInfo(0, f"edit of {step.edit.value}" if step and step.edit else "<start>", None, None, None)]
        out = []
        for i, frame in enumerate(reversed(node.frames)):
            label = f"{node.name} ({node.op_short})" if i == 0 else f"{frame.module_class or ''}.{frame.loc.function}"
            where = frame.module_path if frame.module_path is not None else ""
            name = f"{label} [{where or '<root>'}]" if i == 0 else f"{label} [{where or '<root>'}]".lstrip(".")
            out.append(FrameInfo(i, name, frame.loc.file, frame.loc.line, frame.module_path))
        if not out:
            out.append(FrameInfo(0, f"{node.name} ({node.op_short})", None, None, node.module_path))
        return out

    def names_at(self, position: int | None = None, level: int = 0) -> Mapping[str, Any]:
        """Name -> tensor at a position, materialised lazily (for expressions): the source variables of the
        frames on the stack first (`scores`, `x`), then every value by its Program name (`div_1`)."""
        pos = self.tl.position if position is None else position
        return _LazyValues(self.tl, pos, self.source_names(pos, level))

    def source_names(self, position: int | None = None, level: int = 0) -> dict[str, str]:
        """Source variable -> value name in one frame on the stack (0 = innermost), as Python scopes them:
        the latest assignment in that frame instance before the position."""
        tl = self.tl
        pos = tl.position if position is None else position
        frames = self._frames_at(pos if pos < tl.end else tl.end - 1)
        if pos >= tl.end:
            frames = frames[:1]
        if level >= len(frames):
            return {}
        scope = frame_instance(frames[len(frames) - 1 - level])
        names: dict[str, str] = {}
        for a in self._assignments:
            if a.frame == scope and tl.node_tick[a.node] < pos:
                names.update(a.names)
        return names

    def tensor(self, name: str, position: int | None = None) -> Any:
        self._require_value(name)
        return self.tl.value(name, position)

    def _require_value(self, name: str) -> None:
        if self.program is None or name not in self.program.values:
            raise RewindError(f"no value named '{name}' in the program")

    def value_stats(self, name: str, position: int | None = None) -> dict:
        """min/max/mean, NaN/Inf counts of a value at a position (from the write log when recorded)."""
        tl = self.tl
        pos = tl.position if position is None else position
        version = tl.version_at(name, pos)
        if version is None:
            raise RewindError(f"'{name}' does not exist at tick {pos}")
        if version >= 0:
            rec = tl.log.last_writer(value=name, before=version + 1)
            if rec is not None and rec.tick == version and rec.kind != "view":
                return {"min": rec.stats.min, "max": rec.stats.max, "mean": rec.stats.mean,
                        "nan": rec.stats.nan, "inf": rec.stats.inf}
        s = tl.driver.inspect(tl.value_version(name, version))
        return {"min": s.min, "max": s.max, "mean": s.mean, "nan": s.nan, "inf": s.inf}

    def live_values(self) -> list[str]:
        return self.tl.live()

    def units(self) -> list[str]:
        """The execution units of the chip, by name (unit i is the i-th)."""
        return list(self.tl.unit_names)

    def line_positions(self, file: str, line: int) -> tuple[int, list[int]]:
        """(the line a breakpoint at file:line binds to, the positions where that line's execution begins)."""
        path = str(Path(file).resolve())
        bound, why = resolve_line(self.program, path, line)
        if bound is None:
            raise RewindError(why)
        tl = self.tl
        return bound, line_positions(self.program, tl.node_at, tl.end, path, bound)

    def tensor_stats(self, tensor: Any) -> dict:
        """min/max/mean and NaN/Inf counts of any tensor (an expression's result), computed by the driver."""
        s = self.tl.driver.inspect(tensor)
        return {"min": s.min, "max": s.max, "mean": s.mean, "nan": s.nan, "inf": s.inf}

    def locate(self, name: str) -> Placement:
        """Where a value lives now; for a trace, where it lived when the recorded run wrote it."""
        self._require_value(name)
        tl = self.tl
        recorded = getattr(tl.driver, "recorded_location", None)
        if recorded is not None:
            rec = tl.log.last_writer(value=name, before=tl.position)
            loc = rec.location if rec is not None else recorded(name)
            if loc is not None:
                return Placement(name, (loc,))
        tensor = tl.physical.get(name) if name in tl.physical else tl.value(name)
        tiles = self._instructions.placement(name) if self._instructions is not None else []
        return Placement(name, tuple(tl.driver.placement(name, tensor)) + tuple(tiles))

    def provenance(self, name: str, max_history: int = 64) -> dict:
        """Who wrote a value (last writer before the position), its write history, and its lineage."""
        self._require_value(name)
        tl = self.tl
        last = tl.log.last_writer(value=name, before=tl.position)
        history = tl.log.history(name, before=tl.position)[-max_history:]
        info = self.program.values[name]
        return {
            "value": name, "kind": info.kind, "dtype": info.dtype, "shape": list(info.shape),
            "lastWriter": last.to_dict() if last else None,
            "history": [r.to_dict() for r in history],
            "lineage": lineage(self.program, name).to_dict(self.program),
        }

    def who_wrote(self, address: int) -> WriteRecord | None:
        return self.tl.log.last_writer(address=address, before=self.tl.position)

    def value_at(self, address: int, position: int | None = None) -> dict:
        """Which value lives at device address `address` at a position (now by default): the reverse of `locate`."""
        return occupant(self.tl, address, self.tl.position if position is None else position)

    def evaluate(self, expression: str, level: int = 0) -> Any:
        """A safe expression over the values at the position; source variables as stack frame `level` sees them."""
        return evaluate(expression, self.names_at(level=level))

    # -- edits ---------------------------------------------------------------------------------------
    def write_memory(self, name: str, offset: int, data: bytes) -> int:
        """Overwrite bytes of a value at the position: a recorded edit, undone by stepping back."""
        self._require_value(name)
        tl = self.tl
        tensor = tl.value(name)
        size = tensor.numel() * tensor.element_size()
        if offset < 0 or offset + len(data) > size:
            raise RewindError(f"write of {len(data)} bytes at offset {offset} is outside '{name}' ({size} bytes)")
        tick = tl.edit(name, offset, data, f"write {len(data)} bytes at +{offset}")
        self._invalidate_conditions()
        return tick

    def set_element(self, name: str, index: tuple[int, ...], value: float) -> int:
        """Set one element (a setVariable): encoded in the value's dtype and written as an edit."""
        tensor = self.tensor(name)
        if not tensor.is_contiguous():
            raise RewindError(f"'{name}' is a strided view; set the element on the value it views")
        flat = 0
        for i, (ix, size) in enumerate(zip(index, tensor.shape)):
            if not -size <= ix < size:
                raise RewindError(f"index {ix} is out of range for dimension {i} of '{name}' (size {size})")
            flat = flat * size + (ix % size)
        if len(index) != tensor.dim():
            raise RewindError(f"'{name}' has {tensor.dim()} dimensions; got an index of {len(index)}")
        data = torch.tensor([value], dtype=tensor.dtype).view(torch.uint8).numpy().tobytes()  # bfloat16 too
        return self.write_memory(name, flat * tensor.element_size(), data)

    def _invalidate_conditions(self) -> None:
        for bp in self._all_breakpoints():
            bp.invalidate()

    # -- instruction level (a chip whose nodes run as instruction streams: the sim chip) --------------
    @property
    def instruction(self) -> int:
        """Steps of the current node's interleaving that have run (0 at a node boundary)."""
        return self._instructions.step if self._instructions is not None else 0

    @property
    def physical_memory(self) -> bool:
        """Does the chip expose its memory by physical address (read_address, write_address, disassemble)?"""
        return self._instructions is not None

    def _cursor(self):
        if self._instructions is None:
            raise RewindError(f"driver {self.tl.driver.name} runs nodes, not instruction streams: "
                              "instruction-level requests need a chip like sim")
        return self._instructions

    def disassemble(self, unit: int, tick: int | None = None) -> list[dict]:
        """A unit's instructions in the node at `tick` (default: the current node), each with its source line."""
        return self._cursor().disassemble(unit, tick)

    def set_instruction_breakpoints(self, specs: Iterable[Mapping[str, Any]]) -> list[Breakpoint]:
        """Replace the instruction breakpoints. Each spec: instructionReference (an address), offset?, hitCondition?."""
        return self._cursor().set_breakpoints(specs)

    def instruction_at(self, address: int) -> dict:
        """The node (with its tick), unit and instruction index of a code address."""
        where = self._cursor().driver.instruction_at(address)
        if where is None:
            raise RewindError(f"no instruction at {address:#x}")
        node, unit, pc = where
        return {"node": self.program.nodes[node].name, "tick": self.tl.node_tick[node], "unit": unit, "pc": pc}

    def interleaving(self, tick: int | None = None):
        """The recorded Schedule of the node at `tick` (default: the current one): the unit and instruction of
        each of its steps, and the races and hang found there. The node runs first if it never did."""
        tl = self.tl
        sched = self._cursor().schedule(tl.position if tick is None else tick)
        if sched is None:
            raise RewindError(f"tick {tl.position if tick is None else tick} runs no node on the chip")
        return sched

    def unit_states(self) -> list:
        """Every unit's next instruction or what it waits on, at the current step of the current node."""
        cursor, tl = self._cursor(), self.tl
        if tl.position >= tl.end or tl.node_at(tl.position) is None:
            raise RewindError("no node is running here: step into one")
        return cursor.chip().units()

    def read_address(self, address: int, count: int) -> bytes:
        """Bytes of chip memory at a physical address, as they are at the current position."""
        return self._cursor().read(address, count)

    def write_address(self, address: int, data: bytes) -> int:
        """Write chip memory at a physical address: a recorded edit, undone by stepping back."""
        tick = self._cursor().write(address, data)
        self._invalidate_conditions()
        return tick

    def read_memory(self, name: str, offset: int, count: int) -> bytes:
        self._require_value(name)
        tl = self.tl
        tensor = tl.physical[name] if name in tl.physical else tl.value(name)
        size = tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size()
        start, stop = max(0, offset), min(size, offset + count)
        return tl.driver.read(tensor, start, stop - start) if stop > start else b""

    # -- checkpoints, timeline -----------------------------------------------------------------------
    def checkpoints(self) -> list[dict]:
        return [{"tick": c.tick, "bytes": c.bytes, "tier": c.tier, "values": c.values} for c in self.tl.checkpoints()]

    def timeline_entries(self, start: int = 0, count: int = 100) -> list[dict]:
        tl = self.tl
        out = []
        for tick in range(max(0, start), min(tl.end, start + count)):
            step = tl.step_at(tick)
            node = tl.node_at(tick)
            out.append({
                "tick": tick, "unit": tl.unit_name(step.unit),
                "node": node.name if node else None, "op": node.op if node else "edit",
                "source": {"file": node.loc.file, "line": node.loc.line} if node and node.loc else None,
                "module": node.module_path if node else None,
                "executed": tick < tl.frontier,
                "edit": step.edit.description if step.edit else None,
            })
        return out


class _LazyValues(Mapping):
    def __init__(self, tl: Timeline, position: int, aliases: dict[str, str]):
        self.tl, self.position, self.aliases = tl, position, aliases

    def __getitem__(self, name: str) -> Any:
        name = self.aliases.get(name, name)
        if name not in self.tl.program.values or self.tl.version_at(name, self.position) is None:
            raise KeyError(name)
        return self.tl.value(name, self.position)

    def __iter__(self):
        return iter(list(self.aliases) + self.tl.defined(self.position))

    def __len__(self) -> int:
        return len(self.aliases) + len(self.tl.defined(self.position))


def _keys(frames: tuple[Frame, ...]) -> list[tuple]:
    return [(f.loc.file, f.loc.line, f.module_path) for f in frames]


def _same_frame(frames: tuple[Frame, ...], other: tuple[Frame, ...], depth: int) -> bool:
    """Is `other` still inside the frame instance frames[depth-1] (whatever line it is at)?"""
    if depth == 0:
        return True
    if len(other) < depth:
        return False
    if _keys(other[: depth - 1]) != _keys(frames[: depth - 1]):
        return False
    a, b = frames[depth - 1], other[depth - 1]
    return (a.loc.file, a.loc.function, a.module_path) == (b.loc.file, b.loc.function, b.module_path)


def _in_line(frames: tuple[Frame, ...], other: tuple[Frame, ...], depth: int) -> bool:
    return _same_frame(frames, other, depth) and (depth == 0 or other[depth - 1].loc.line == frames[depth - 1].loc.line)


def _describe_bp(bp: Breakpoint) -> str:
    if bp.kind == "line":
        return f"breakpoint {bp.id} at {Path(bp.file).name}:{bp.line}"
    if bp.kind == "function":
        return f"breakpoint {bp.id} on {bp.spec}"
    return f"data breakpoint {bp.id}: write to {bp.spec}"


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.numel() == 1:
            return f"{value.item():.6g}" if value.is_floating_point() else str(value.item())
        return f"tensor(shape={list(value.shape)}, dtype={str(value.dtype).removeprefix('torch.')})"
    return str(value)
