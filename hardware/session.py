"""The Session: the one Python API every surface (DAP, console, LSP, tests) drives.

It owns the driver, the Program, the Timeline and the breakpoints. Every method except
`pause()` runs on the caller's (the adapter's single worker) thread and blocks. The
Session knows nothing of DAP: it reports what happens as domain events (stopped, output,
progress, invalidated) through `on_event`.

This file holds its lifecycle (launch, traces, close) and state; the rest is by concern:
  hardware/motion.py             run, step, goto, restart: the one scan over positions, and its Stops
  hardware/breakpoints.py        line, function and data breakpoints: set, verified, held at a position
  hardware/exception_filters.py  nan, inf, divergence: the exception a step raised
  hardware/inspection.py         frames, names, values, locations, provenance, expressions, edits
  hardware/instruction_level.py  disassembly, instruction breakpoints, interleavings (the sim chip)
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from checkpoint import recording
from checkpoint.tiers import DiskTier, HostTier
from checkpoint.timeline import Tick, Timeline
from hardware.breakpoints import Breakpoint, BreakpointTable
from hardware.driver import open_driver
from hardware.errors import NotStoppedError, RewindError
from hardware.events import SessionEvent
from hardware.exception_filters import ExceptionDetails, ExceptionFilters
from hardware.frontends.torch_export import load_program
from hardware.inspection import FrameInfo, Inspection
from hardware.instruction_level import InstructionLevel
from hardware.motion import Direction, Motion, Stop
from hardware.program import Program
from hardware.source_names import Assignment, assignments

# Sessions launched and not closed yet (a Session dropped unclosed leaves when collected).
_OPEN: "weakref.WeakSet[Session]" = weakref.WeakSet()

__all__ = ["Direction", "ExceptionDetails", "FrameInfo", "LaunchOptions", "Session", "SessionEvent", "Stop"]


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
    overwrite: bool = False  # record: replace an existing file at `record` (when the recording is closed)
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


class Session(Motion, Inspection, InstructionLevel):
    """Hardware session manager: launch, move in both directions, inspect, edit."""

    def __init__(self, on_event: Callable[[SessionEvent], None] | None = None):
        self.on_event = on_event or (lambda e: None)
        self.timeline: Timeline | None = None
        self.program: Program | None = None
        self.options: LaunchOptions | None = None
        self.breakpoints = BreakpointTable(self)
        self.exceptions = ExceptionFilters(self)
        self.last_stop: Stop | None = None
        self._pause = threading.Event()
        self._forensics = None
        self._experiments = None
        self._instructions = None  # InstructionCursor, on a driver whose nodes run as instruction streams

    # -- lifecycle -----------------------------------------------------------------------------
    def launch(self, options: LaunchOptions, program: Program | None = None) -> None:
        """Load the user's program (export it unless given) onto the driver; position 0.

        With `options.trace`, open that trace instead (no device needed); with `options.record`,
        record every step to a trace file as it runs. A program that does not load leaves a loaded one as it was."""
        driver = None
        if not options.trace:  # what can fail on the user's side fails before the loaded program is let go
            program = program or load_program(options.program, options.entry)
            driver = open_driver(options.driver, options.driver_options())
        self.close()  # a relaunch (restart with new arguments) finishes the previous run's recording
        try:
            self._load(options, program, driver)
        except BaseException:  # nothing half-loaded stays: the Session says no program is loaded
            self.timeline = self.program = None
            raise
        self._attach_cursor()
        self._assignments: list[Assignment] = assignments(self.program)
        self.breakpoints.bind_lines()

    def _load(self, options: LaunchOptions, program: Program | None, driver: Any) -> None:
        _OPEN.add(self)
        self.options = options
        self.launch_notes: list[str] = []  # what the launch's answer tells the user (a trace cut short)
        if options.trace:
            recompute = open_driver(options.driver) if options.driver != "auto" else None
            self.program, self.timeline, reader = recording.open_trace(options.trace, self._make_timeline, recompute)
            self.trace_reader = reader
            self.launch_notes = list(reader.contents.warnings)
            for warning in reader.contents.warnings:
                self.on_event(SessionEvent("output", {"category": "important", "text": warning + "\n"}))
        else:
            driver.on_report = lambda text: self.on_event(SessionEvent("output", {"category": "important",
                                                                                   "text": text + "\n"}))
            self.program = program
            self.timeline = self._make_timeline(self.program, driver, None)
            if options.record:
                self._recorder = recording.record(self.timeline, options.record, options.overwrite,
                                                  self._files_in_use(), on_error=self._report_recording_error)
                self.on_event(SessionEvent("recording", {"partial": str(self._recorder.partial_path),
                                                         "target": str(self._recorder.target_path),
                                                         "overwrite": options.overwrite}))

    def _make_timeline(self, program: Program, driver, archive) -> Timeline:
        o = self.options
        tiers = None
        if o.host_mb > 0 or o.disk_mb > 0:
            disk = DiskTier(int(o.disk_mb * 2**20), o.spill_dir) if o.disk_mb > 0 else None
            tiers = HostTier(int(o.host_mb * 2**20), disk)
        return Timeline(program, driver, budget=int(o.budget_mb * 2**20), every=o.every,
                        on_nondeterminism=self._report_nondeterminism, tiers=tiers, archive=archive,
                        check_batch=o.check_batch, device_pool=o.device_pool)

    def save_trace(self, path: str, overwrite: bool = False) -> dict:
        """Write the whole recorded run to `path` (values evicted from the ring are recomputed). The file
        appears whole or not at all; an existing file is replaced only with `overwrite`, and never the
        trace this session has open, the file it records to, or the program's sources
        (checkpoint/safe_files.py says what else is refused)."""
        tl = self.tl
        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            if time.monotonic() - started > 0.5:
                self.on_event(SessionEvent("progress", {"message": f"saving tick {done} of {total}",
                                                        "percentage": 100.0 * done / max(total, 1)}))
        writer = recording.save(tl, path, progress, overwrite, self._files_in_use())
        return {"path": str(writer.path), "bytes": writer.size, "ticks": tl.frontier, "rawBytes": writer.bytes_raw}

    def _files_in_use(self) -> dict[str, str]:
        """Files this session reads or writes, which a save or a recording must never replace."""
        used: dict[str, str] = {}
        reader = getattr(self, "trace_reader", None)
        if reader is not None:
            used[str(reader.path)] = "the trace this session has open"
        recorder = getattr(self, "_recorder", None)
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
        self.on_event(SessionEvent("output", {"category": "important", "text": message + "\n"}))

    def close(self) -> None:
        """End the session: finish a recording (index and footer), free spill files, and give back the
        process-wide state it changed. torch's determinism settings go back to what they were when the last
        driver holding them lets go (hardware/determinism.py), whatever order Sessions close in; the fix
        sources registered with linecache are dropped when the last open Session closes."""
        from provenance.fixes import forget_sources

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
        recorder, self._recorder = getattr(self, "_recorder", None), None
        if recorder is not None:  # this session's own: a branch holds the Timeline's aside while installed
            try:
                recorder.close()  # moves the recording onto its file
            except RewindError as exc:  # kept where it was written; say where
                self._report_recording_error(str(exc))
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

    # -- breakpoints and exception filters (hardware/breakpoints.py, hardware/exception_filters.py) --------
    @property
    def line_breakpoints(self) -> dict[str, list[Breakpoint]]:
        return self.breakpoints.line

    @property
    def function_breakpoints(self) -> list[Breakpoint]:
        return self.breakpoints.function

    @property
    def data_breakpoints(self) -> list[Breakpoint]:
        return self.breakpoints.data

    def set_line_breakpoints(self, file: str, specs: Iterable[Mapping[str, Any]]) -> list[Breakpoint]:
        """Replace the breakpoints of `file`. Each spec: line, condition?, hitCondition?, logMessage?."""
        return self.breakpoints.set_line(file, specs)

    def set_function_breakpoints(self, specs: Iterable[Mapping[str, Any]]) -> list[Breakpoint]:
        """Replace the function breakpoints. Each spec: name (a node, an op or a module path), condition?,
        hitCondition?."""
        return self.breakpoints.set_function(specs)

    def set_data_breakpoints(self, specs: Iterable[Mapping[str, Any]]) -> list[Breakpoint]:
        """Replace the data breakpoints. Each spec: dataId (a value name), condition?, hitCondition?."""
        return self.breakpoints.set_data(specs)

    @property
    def exception_filters(self) -> set[str]:
        return self.exceptions.filters

    def set_exception_filters(self, filters: Iterable[str]) -> None:
        """nan, inf: stop after the step that wrote a NaN / Inf its inputs did not carry; divergence: stop
        after the step where the pass first leaves its reference (see provenance/forensics.py)."""
        self.exceptions.choose(filters)

    def nonfinite_at(self, tick: int, filters: Iterable[str] = ("nan", "inf")) -> ExceptionDetails | None:
        """Did step `tick` produce a NaN/Inf of a kind in `filters` (one its inputs did not carry)?"""
        return self.exceptions.nonfinite_at(tick, filters)

    # -- forensics and experiments (provenance/) ------------------------------------------------------
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
