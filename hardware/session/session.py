"""The Session: the one Python API every surface (DAP, console, LSP, tests) drives.

It owns the driver, the Program, the Timeline and the breakpoints. Every method except
`pause()` and `interrupt()` runs on the caller's (the adapter's single worker) thread and blocks.
The Session knows nothing of DAP: it reports what happens as domain events (hardware/events.py)
through `on_event`.

This file holds its lifecycle (launch, traces, close) and the API it offers; the work is done by the
collaborators it composes, each handed the shared SessionState and what else it needs:
  hardware/session/state.py              the loaded run, the last stop, the pause request, on_event
  hardware/session/motion.py             run, step, goto, restart: the one scan over positions, and its Stops
  hardware/session/breakpoints.py        line, function and data breakpoints: set, verified, held at a position
  hardware/session/exception_filters.py  nan, inf, divergence: the exception a step raised
  hardware/session/inspection.py         frames, names, values, locations, provenance, expressions, edits
  hardware/session/instruction_level.py  disassembly, instruction breakpoints, interleavings (the sim chip)
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Iterable, Mapping

from checkpoint import recording
from checkpoint.tiers import DiskTier, HostTier
from checkpoint.timeline import Timeline
from checkpoint.trace import TraceReader, TraceWriter
from hardware.drivers import open_driver, open_kernel, trace_driver
from hardware.errors import RewindError
from hardware.events import (ExceptionDetails, Nondeterminism, Output, ProgressAfter, RecordingStarted,
                             SessionEvent)
from hardware.session.program_cache import load_program
from hardware.memory import Placement
from hardware.program import Node, Program
from hardware.session.breakpoints import (MODES, Breakpoint, BreakpointTable, DataSpec, FunctionSpec, LineSpec,
                                         bad_mode)
from hardware.session.exception_filters import ExceptionFilters
from hardware.session.inspection import Inspection, Scan
from hardware.session.instruction_cursor import InstructionSpec
from hardware.session.instruction_level import InstructionLevel
from hardware.session.motion import Motion
from hardware.session.state import FrameInfo, LaunchOptions, SessionState
from hardware.ticks import Direction, Stop, Tick
from provenance.experiments import Experiments
from provenance.fixes import forget_sources
from provenance.forensics import Forensics
from provenance.writelog import WriteRecord

KERNEL_ENTRY = "kernel"  # a kernel file's entry: kernel() -> (jit_function, grid, args, kwargs), docs/kernels.md
# Sessions launched and not closed yet (a Session dropped unclosed leaves when collected).
_OPEN: "weakref.WeakSet[Session]" = weakref.WeakSet()

__all__ = ["DataSpec", "Direction", "ExceptionDetails", "FrameInfo", "FunctionSpec", "InstructionSpec", "LaunchOptions",
           "LineSpec", "Session", "SessionEvent", "Stop"]


class Session:
    """Hardware session manager: launch, move in both directions, inspect, edit."""

    def __init__(self, on_event: Callable[[SessionEvent], None] | None = None):
        self.state = state = SessionState(on_event or (lambda e: None))
        # Each collaborator is handed the state and what it uses of the others (late-bound where two use each other).
        self.breakpoints = BreakpointTable(state, names_at=lambda q: self.inspection.names_at(q))
        self.exceptions = ExceptionFilters(state, forensics=lambda: self.forensics,
                                           value_stats=lambda name, tick: self.inspection.value_stats(name, tick))
        self.instructions = InstructionLevel(state, self.breakpoints, self.exceptions,
                                             stopped=lambda stop: self.motion.stopped(stop),
                                             write_value=lambda name, offset, data: self.inspection.write_memory(
                                                 name, offset, data))
        self.inspection = Inspection(state, self.breakpoints, cursor=lambda: self.instructions.cursor)
        self.motion = Motion(state, self.breakpoints, self.exceptions, self.instructions)
        self.launch_notes: list[str] = []  # what the launch's answer tells the user (a trace cut short)
        self.trace_reader: TraceReader | None = None  # the trace this session has open
        self._recorder: TraceWriter | None = None  # the continuous recording of this run
        self._forensics: Forensics | None = None
        self._experiments: Experiments | None = None

    # -- the shared state -----------------------------------------------------------------------------
    @property
    def on_event(self) -> Callable[[SessionEvent], None]:
        return self.state.on_event

    @property
    def timeline(self) -> Timeline | None:
        return self.state.timeline

    @property
    def program(self) -> Program | None:
        return self.state.program

    @property
    def options(self) -> LaunchOptions | None:
        return self.state.options

    @property
    def last_stop(self) -> Stop | None:
        return self.state.last_stop

    # -- lifecycle -----------------------------------------------------------------------------
    def launch(self, options: LaunchOptions, program: Program | None = None) -> None:
        """Load the user's program (export it unless given) onto the driver; position 0.

        With `options.trace`, open that trace instead (no device needed); with `options.record`,
        record every step to a trace file as it runs. A program that does not load leaves a loaded one as it was."""
        driver = None
        if options.breakpoint_mode not in MODES:
            raise RewindError(bad_mode(options.breakpoint_mode) + " (the launch's breakpoint mode)")
        if not options.trace and options.entry == KERNEL_ENTRY and program is None:  # a Triton kernel's launch
            program, driver = open_kernel(options.program, options.driver)
        elif not options.trace:  # what can fail on the user's side fails before the loaded program is let go
            program = program or load_program(options.program, options.entry, options.steps, options.driver,
                                              note=lambda text: self.on_event(Output(text + "\n")))
            driver = open_driver(options.driver, options.driver_options())
        self.close()  # a relaunch (restart with new arguments) finishes the previous run's recording
        try:
            self._load(options, program, driver)
        except BaseException:  # nothing half-loaded stays: the Session says no program is loaded
            self.state.timeline = self.state.program = None
            raise
        self.instructions.attach()
        self.inspection.bind(self.program)
        self.breakpoints.bind_lines()

    def _load(self, options: LaunchOptions, program: Program | None, driver: Any) -> None:
        _OPEN.add(self)
        self.state.options = options
        self.launch_notes = []
        if options.trace:
            recompute = open_driver(options.driver) if options.driver != "auto" else None
            self.state.program, self.state.timeline, reader = recording.open_trace(
                options.trace, self._make_timeline, trace_driver, recompute)
            self.trace_reader = reader
            self.launch_notes = list(reader.contents.warnings)
            for warning in reader.contents.warnings:
                self.on_event(Output(warning + "\n"))
        else:
            driver.on_report = lambda text: self.on_event(Output(text + "\n"))
            self.state.program = program
            self.state.timeline = self._make_timeline(program, driver, None)
            if options.record:
                self._recorder = recording.record(self.timeline, options.record, options.overwrite,
                                                  self._files_in_use(), on_error=self._report_recording_error)
                self.on_event(RecordingStarted(str(self._recorder.partial_path), str(self._recorder.target_path),
                                               options.overwrite))

    def _make_timeline(self, program: Program, driver, archive) -> Timeline:
        o = self.options
        tiers = None
        if o.host_mb > 0 or o.disk_mb > 0:
            disk = DiskTier(int(o.disk_mb * 2**20), o.spill_dir) if o.disk_mb > 0 else None
            tiers = HostTier(int(o.host_mb * 2**20), disk)
        return Timeline(program, driver, budget=int(o.budget_mb * 2**20), every=o.every,
                        on_nondeterminism=self._report_nondeterminism, tiers=tiers, archive=archive,
                        check_batch=o.check_batch, device_pool=o.device_pool,
                        fast_forward=o.fast_forward)

    def save_trace(self, path: str, overwrite: bool = False) -> dict:
        """Write the whole recorded run to `path` (values evicted from the ring are recomputed). The file
        appears whole or not at all; an existing file is replaced only with `overwrite`, and never the
        trace this session has open, the file it records to, or the program's sources
        (checkpoint/safe_files.py says what else is refused)."""
        tl = self.tl
        progress = ProgressAfter(self.on_event)
        writer = recording.save(tl, path, lambda done, total: progress(f"saving tick {done} of {total}", done, total),
                                overwrite, self._files_in_use())
        return {"path": str(writer.path), "bytes": writer.size, "ticks": tl.frontier, "rawBytes": writer.bytes_raw}

    def _files_in_use(self) -> dict[str, str]:
        """Files this session reads or writes, which a save or a recording must never replace."""
        used: dict[str, str] = {}
        reader = self.trace_reader
        if reader is not None:
            used[str(reader.path)] = "the trace this session has open"
        recorder = self._recorder
        if recorder is not None and not recorder.closed:
            used[str(recorder.target_path)] = "the file this session is recording to"
            used[str(recorder.partial_path)] = "this session's recording in progress"
        o = self.options
        if o is not None and o.reference and os.path.isfile(o.reference):
            used[o.reference] = "the reference this session compares against"
        if o is not None and o.program:
            used[o.program] = "the program being debugged"
        for source in (self.program.source_files if self.program is not None else ()):
            used.setdefault(source, "a source file of the program being debugged")
        return used

    def _report_recording_error(self, message: str) -> None:
        self.on_event(Output(message + "\n"))

    def close(self) -> None:
        """End the session: finish a recording (index and footer), free spill files and the memory of the retained
        values (Timeline.close), and give back the process-wide state it changed. torch's determinism settings go
        back to what they were when the last driver holding them lets go (hardware/determinism.py), whatever order
        Sessions close in; the fix sources registered with linecache are dropped when the last open Session
        closes."""
        _OPEN.discard(self)
        if not _OPEN:
            forget_sources()
        tl = self.timeline
        if tl is None:
            return
        for driver in (tl.driver, getattr(tl.driver, "recompute", None)):  # a trace's recompute driver
            hold = getattr(driver, "determinism", None)
            if hold is not None:
                hold.release()
        # their reference pass's driver holds the settings too: it lets go when collected
        self._forensics = self._experiments = None
        recorder, self._recorder = self._recorder, None
        if recorder is not None:  # this session's own: a branch holds the Timeline's aside while installed
            try:
                recorder.close()  # moves the recording onto its file
            except RewindError as exc:  # kept where it was written; say where
                self._report_recording_error(str(exc))
        tl.close()
        reader = self.trace_reader
        if reader is not None:
            reader.close()
            self.trace_reader = None

    def _report_nondeterminism(self, finding) -> None:
        self.on_event(Output(str(finding) + "\n"))
        self.on_event(Nondeterminism(finding.tick, finding.node, finding.value))

    @property
    def tl(self) -> Timeline:
        return self.state.tl

    @property
    def position(self) -> Tick:
        return Tick(self.tl.position)

    @property
    def end(self) -> Tick:
        return Tick(self.tl.end)

    # -- breakpoints and exception filters (hardware/session/breakpoints.py, exception_filters.py) ----------------
    @property
    def line_breakpoints(self) -> dict[str, list[Breakpoint]]:
        return self.breakpoints.line

    @property
    def function_breakpoints(self) -> list[Breakpoint]:
        return self.breakpoints.function

    @property
    def data_breakpoints(self) -> list[Breakpoint]:
        return self.breakpoints.data

    def set_line_breakpoints(self, file: str, specs: Iterable[LineSpec]) -> list[Breakpoint]:
        """Replace the breakpoints of `file` (of a kernel's file: on its operations, in the instruction cursor)."""
        if self.instructions.has_code_lines(file):
            return self.instructions.set_code_line_breakpoints(file, specs)
        return self.breakpoints.set_line(file, specs)

    def set_function_breakpoints(self, specs: Iterable[FunctionSpec]) -> list[Breakpoint]:
        """Replace the function breakpoints (on a node, an op or a module path)."""
        return self.breakpoints.set_function(specs)

    def set_data_breakpoints(self, specs: Iterable[DataSpec]) -> list[Breakpoint]:
        """Replace the data breakpoints (on the writes of a value; of a kernel's tensor or element: `out_ptr[3]`)."""
        specs = list(specs)
        if self.instructions.cursor is None:
            return self.breakpoints.set_data(specs)
        chip = [s for s in specs if self.instructions.watches(s.value)]
        rest = [s for s in specs if s not in chip]
        made = iter(self.instructions.set_element_breakpoints(chip) + self.breakpoints.set_data(rest))
        found = {id(s): next(made) for s in chip}
        found |= {id(s): next(made) for s in rest}
        return [found[id(s)] for s in specs]

    @property
    def exception_filters(self) -> set[str]:
        return self.exceptions.filters

    def set_exception_filters(self, filters: Iterable[str], conditions: Mapping[str, str] | None = None) -> None:
        """nan, inf: stop after the step that wrote a NaN / Inf its inputs did not carry; divergence: stop
        after the step where the pass first leaves its reference (see provenance/forensics.py); loss-spike: stop
        at the start of a training step whose loss is over k times the running median (`conditions`:
        {"loss-spike": "k=5"}; hardware/session/exception_filters.py)."""
        self.exceptions.choose(filters, conditions)

    def nonfinite_at(self, tick: Tick, filters: Iterable[str] = ("nan", "inf")) -> ExceptionDetails | None:
        """Did step `tick` produce a NaN/Inf of a kind in `filters` (one its inputs did not carry)?"""
        return self.exceptions.nonfinite_at(tick, filters)

    # -- forensics and experiments (provenance/) ------------------------------------------------------
    @property
    def forensics(self) -> Forensics:
        """Numerical forensics of this pass against its reference (provenance/forensics.py)."""
        if self._forensics is None or self._forensics.timeline is not self.tl:
            self._forensics = Forensics(self)
        return self._forensics

    @property
    def experiments(self) -> Experiments:
        """Named branches of patches on this pass, measured and undone (provenance/experiments.py)."""
        if self._experiments is None or self._experiments.timeline is not self.tl:
            self._experiments = Experiments(self)
        return self._experiments

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
                "step": node.step if node else self.state.step_of(tick) or 0, "phase": node.phase if node else "edit",
            })
        return out

    # -- motion (hardware/session/motion.py) ---------------------------------------------------------
    def start(self) -> Stop:
        """After configuration: stop at entry, or run to the first stop."""
        return self.motion.start()

    def pause(self) -> None:
        """Thread-safe: ask the running motion, or the one about to start, to stop at its next tick."""
        self.motion.pause()

    def run(self, direction: Direction = Direction.FORWARD) -> Stop:
        """Continue (or reverse-continue) to the next position where a breakpoint holds."""
        return self.motion.run(direction)

    def step(self, direction: Direction = Direction.FORWARD, granularity: str = "statement",
             kind: str = "over", unit: int | None = None, single_thread: bool = False) -> Stop:
        """One step: kind over, in, out; granularity statement (a source line; `line` is the same) or instruction
        (one node; one chip instruction on a chip like sim). Motion.step says how."""
        return self.motion.step(direction, granularity, kind, unit, single_thread)

    def step_in_targets(self, level: int | None = 0) -> list[Tick]:
        """The ticks of the nodes still to run on the line of stack frame `level` (None: the outermost frame):
        where step_into can go."""
        return self.motion.step_in_targets(level)

    def step_into(self, tick: Tick) -> Stop:
        """Run forward to the instant before one of step_in_targets' nodes runs (one node at a time on any chip)."""
        return self.motion.step_into(tick)

    def goto(self, tick: Tick) -> Stop:
        return self.motion.goto(tick)

    def goto_step(self, step: int) -> Stop:
        """To the start of training step `step` (from 0): its first node is about to run."""
        return self.motion.goto_step(step)

    def step_start(self, step: int) -> Tick:
        """Where training step `step` starts; a RewindError for a step the run does not have."""
        return self.motion.step_start(step)

    def steps(self) -> list[dict]:
        """A training run's steps: each one's first tick and its loss value (none for an inference pass)."""
        program = self.program
        return [{"step": k, "tick": self.state.step_start(k), "loss": loss} for k, loss in enumerate(program.losses)]

    def restore(self, tick: Tick) -> Stop:
        """Restore a checkpoint: go to its tick, where its values are retained."""
        return self.motion.restore(tick)

    def restart(self) -> Stop:
        return self.motion.restart()

    def exception_info(self) -> ExceptionDetails:
        return self.motion.exception_info()

    # -- inspection and edits (hardware/session/inspection.py) -----------------------------------------
    def current_node(self) -> Node | None:
        return self.inspection.current_node()

    def frame_node(self) -> Node | None:
        """The node the top frame shows: about to run, or just run (after a write the Session stopped for, and at
        the end)."""
        return self.inspection.frame_node()

    def frames(self, unit: int | None = None) -> list[FrameInfo]:
        """The node at its source line, then the enclosing module forward frames, innermost first; right after a
        write the Session stopped for, the node that wrote."""
        return self.inspection.frames(unit)

    def names_at(self, position: Tick | None = None, level: int = 0) -> Mapping[str, Any]:
        """Name -> tensor at a position (the frame's source variables, then Program names), materialised lazily."""
        return self.inspection.names_at(position, level)

    def source_names(self, position: Tick | None = None, level: int = 0) -> dict[str, str]:
        """Source variable -> value name in one frame on the stack (0 = innermost)."""
        return self.inspection.source_names(position, level)

    def frame_arguments(self, level: int = 0) -> dict[str, str]:
        """The parameters of stack frame `level` bound to the tensors it was called with."""
        return self.inspection.frame_arguments(level)

    def resolve_name(self, name: str, level: int = 0) -> str | None:
        """The Program value a name means in stack frame `level` (a source variable, or a Program value); None if
        neither; a RewindError saying why for a variable that holds no single tensor there now."""
        return self.inspection.resolve(name, level)

    def gradients(self) -> dict[str, str]:
        """Each parameter's gradient value in the training step shown, by the parameter's module path;
        `grad(l1.weight)` reads one in an expression."""
        return self.inspection.gradients()

    def evaluate(self, expression: str, level: int = 0, position: Tick | None = None) -> Any:
        """A safe expression over the values at the position (or at `position`); `interrupt()` stops it."""
        return self.inspection.evaluate(expression, level, position)

    def find(self, expression: str, start: Tick, limit: int) -> Scan:
        """The first position from `start` (at most `limit` of them) where `expression` holds; positions where a
        name of it is not defined yet are skipped. The position does not move; `interrupt()` stops the scan."""
        return self.inspection.find(expression, start, limit)

    def history(self, name: str) -> tuple[list[str], list[dict]]:
        """Every write over the run to the values a source variable (anywhere) or a Program value (`$name`) names."""
        return self.inspection.history(name)

    def breakpoint_stops(self, start: Tick, stop: Tick) -> list[Stop]:
        """Where breakpoints hold at positions start..stop - 1, as a continue would stop there (nothing printed).
        The pass is run to its end first: conditions read values there."""
        self.tl.record_through()
        return self.breakpoints.stops(start, stop)

    def interrupt(self) -> None:
        """Thread-safe: stop the evaluation that runs now (no effect on motions: pause() stops those)."""
        self.inspection.interrupt()

    def tensor(self, name: str, position: Tick | None = None) -> Any:
        return self.inspection.tensor(name, position)

    def value_stats(self, name: str, position: Tick | None = None) -> dict:
        """min/max/mean, NaN/Inf counts of a value at a position."""
        return self.inspection.value_stats(name, position)

    def tensor_stats(self, tensor: Any) -> dict:
        return self.inspection.tensor_stats(tensor)

    def live_values(self) -> list[str]:
        return self.inspection.live_values()

    def units(self) -> list[str]:
        """The execution units of the chip, by name (unit i is the i-th)."""
        return self.inspection.units()

    def line_positions(self, file: str, line: int) -> tuple[int, list[int]]:
        """(the line a breakpoint at file:line binds to, the positions where that line's execution begins)."""
        return self.inspection.line_positions(file, line)

    def locate(self, name: str) -> Placement:
        """Where a value lives now; for a trace, where it lived when the recorded run wrote it."""
        return self.inspection.locate(name)

    def locate_elements(self, name: str) -> dict | None:
        """On a chip that records its accesses element by element (a kernel's, docs/kernels.md): where a tensor of
        its code or one element of it (`out_ptr[37]`) lives, and which units wrote and read it before the position;
        None when `name` names none of its tensors."""
        return self.instructions.locate_elements(name)

    def provenance(self, name: str, max_history: int = 64) -> dict:
        """Who wrote a value (last writer before the position), its write history, and its lineage."""
        return self.inspection.provenance(name, max_history)

    def who_wrote(self, address: int) -> WriteRecord | None:
        return self.inspection.who_wrote(address)

    def value_at(self, address: int, position: Tick | None = None) -> dict:
        """Which value lives at device address `address` at a position (now by default)."""
        return self.inspection.value_at(address, position)

    def read_memory(self, name: str, offset: int, count: int) -> bytes:
        return self.inspection.read_memory(name, offset, count)

    def write_memory(self, name: str, offset: int, data: bytes) -> int:
        """Overwrite bytes of a value at the position: a recorded edit, undone by stepping back."""
        return self.inspection.write_memory(name, offset, data)

    def set_element(self, name: str, index: tuple[int, ...], value: float) -> int:
        """Set one element: encoded in the value's dtype and written as an edit."""
        return self.inspection.set_element(name, index, value)

    def after_edit(self, value: str) -> Stop:
        """The stop an edit of `value` left (write_memory, set_element): where the position is now."""
        return self.motion.after_edit(value)

    # -- the instruction level (hardware/session/instruction_level.py) ---------------------------------
    @property
    def instruction(self) -> int:
        """Steps of the current node's interleaving that have run (0 at a node boundary)."""
        return self.instructions.instruction

    @property
    def physical_memory(self) -> bool:
        """Does the chip expose its memory by physical address (read_address, write_address, disassemble)?"""
        return self.instructions.physical_memory

    def disassemble(self, unit: int, tick: Tick | None = None) -> list[dict]:
        return self.instructions.disassemble(unit, tick)

    def set_instruction_breakpoints(self, specs: Iterable[InstructionSpec]) -> list[Breakpoint]:
        return self.instructions.set_instruction_breakpoints(specs)

    def instruction_at(self, address: int) -> dict:
        return self.instructions.instruction_at(address)

    def interleaving(self, tick: Tick | None = None):
        return self.instructions.interleaving(tick)

    def unit_states(self) -> list:
        return self.instructions.unit_states()

    def read_address(self, address: int, count: int) -> bytes:
        return self.instructions.read_address(address, count)

    def write_address(self, address: int, data: bytes) -> int:
        return self.instructions.write_address(address, data)
