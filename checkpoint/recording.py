"""Saving a Timeline to a trace, recording one continuously, and opening one again.

Writing never destroys a file (checkpoint/safe_files.py): a trace is written to a hidden temporary
beside its target and moved into place whole; `adopt_partial` moves the temporary of a recording
whose process died onto its target."""

from __future__ import annotations

from typing import Any, Callable

from checkpoint.codec import encode_program
from checkpoint.ring import Checkpoint
from checkpoint.steps import Edit, Step, edit_frame
from checkpoint.timeline import Timeline
from checkpoint.trace import TraceArchive, TraceReader, TraceWriter, adopt_partial
from checkpoint.versions import INITIAL
from hardware.driver import Driver
from hardware.program import Program
from hardware.recorded import RecordedInitial, TraceDriverFactory
from provenance.writelog import KIND_NAMES, KIND_VIEW


def begin(writer: TraceWriter, program: Program, driver: Driver, initial: dict[str, Any]) -> None:
    """The frames every trace starts with: what ran where, the Program with its sources, the inputs."""
    chip = driver.describe()
    writer.meta(driver=driver.name, chip=chip.name, units=[u.name for u in chip.units],
                initial_locations={n: driver.locate(t).to_dict() for n, t in initial.items()})
    writer.program(encode_program(program))
    for name, tensor in initial.items():
        writer.initial(name, tensor)


def record(timeline: Timeline, path: str, overwrite: bool = False, in_use: dict[str, str] | None = None,
           on_error: Callable[[str], None] | None = None) -> TraceWriter:
    """Start continuous recording: every step, write and written value from now on goes to the writer's
    `partial_path`, a hidden temporary beside `path`; closing the writer moves it onto `path` (an existing
    file there is replaced only with `overwrite`, and not before). `on_error` hears of a write that
    failed (a full disk): the recording stops there, the run goes on."""
    writer = TraceWriter(path, overwrite, in_use, doing="record to", on_error=on_error)
    try:
        begin(writer, timeline.program, timeline.driver, _initial_contents(timeline))
    except BaseException:
        writer.abort()
        raise
    timeline.recorder = writer
    return writer


def save(timeline: Timeline, path: str, progress: Callable[[int, int], None] | None = None,
         overwrite: bool = False, in_use: dict[str, str] | None = None) -> TraceWriter:
    """Write everything the Timeline recorded so far; evicted values are recomputed to be saved. The trace
    appears at `path` whole when done, or not at all (checkpoint/safe_files.py); an existing file there
    is replaced only with `overwrite`."""
    writer = TraceWriter(path, overwrite, in_use)
    try:
        _save_frames(writer, timeline, progress)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return writer


def _save_frames(writer: TraceWriter, timeline: Timeline, progress: Callable[[int, int], None] | None) -> None:
    begin(writer, timeline.program, timeline.driver, _initial_contents(timeline))
    log = timeline.log
    rows_by_tick: dict[int, list[int]] = {}
    for i in range(len(log)):
        rows_by_tick.setdefault(log.row(i)[0], []).append(i)
    for tick in range(timeline.frontier):
        step = timeline.schedule[tick]
        writer.step(tick, step.unit, step.node, edit_frame(step.edit))
        for i in rows_by_tick.get(tick, []):
            row = log.row(i)
            writer.write(row)
            name, kind = row[3], row[4]
            if kind != KIND_VIEW and name not in timeline.physical:
                writer.version(name, tick, timeline.value_version(name, tick))
        if progress:
            progress(tick + 1, timeline.frontier)
    for cp in sorted(timeline.ring.checkpoints.values(), key=lambda c: c.tick):
        writer.checkpoint(cp.tick, sorted(cp.pins))


def _initial_contents(timeline: Timeline) -> dict[str, Any]:
    """Initial values as they were at tick 0 (a mutated buffer's pre-image, not its current memory)."""
    return {name: timeline.value_version(name, INITIAL) for name in timeline.initial}


def open_trace(path: str, make_timeline: Callable[[Program, Driver, TraceArchive], Timeline],
               driver_for: TraceDriverFactory, recompute: Driver | None = None) -> tuple[Program, Timeline, TraceReader]:
    """Rebuild the Program and a Timeline positioned at tick 0 whose recorded steps come from the trace.

    `driver_for` builds the driver standing in for the recording device from the reader and `recompute`
    (the registry's `hardware.drivers.trace_driver`).
    The reader has checked every frame (checkpoint/trace.py): what it returns names only nodes, values and
    ticks the trace holds, and ends at the last step whose writes all reached the file. A recording that
    ends before the program does adds a note to `reader.contents.warnings` saying where."""
    reader = TraceReader(path)
    try:
        c = reader.contents
        program = reader.program
        program.initial = RecordedInitial(reader)
        driver = driver_for(reader, recompute)
        timeline = make_timeline(program, driver, TraceArchive(reader))
        steps = [Step(unit, node, Edit(edit["value"], edit["offset"], bytes(edit["data"]),
                                       edit.get("description", "")) if edit else None)
                 for _tick, unit, node, edit in c.steps]
        ran = {s.node for s in steps if s.node is not None}
        recorded = len(steps)
        steps += [Step(0, n.index) for n in program.nodes if n.index not in ran]
        timeline.schedule = steps
        timeline.node_tick = [0] * len(program.nodes)
        for tick, step in enumerate(steps):
            if step.node is not None:
                timeline.node_tick[step.node] = tick
        for row in c.writes:
            timeline.log.append_row(row)
            timeline.versions.setdefault(row[3], [INITIAL] if row[3] in timeline.initial else []).append(row[0])
        timeline.frontier = recorded
        timeline.store.resync()
        for tick, pins in c.checkpoints:
            timeline.ring.checkpoints[tick] = Checkpoint(tick, frozenset((p[0], p[1]) for p in pins), "trace",
                                                         thinned=True)
    except BaseException:
        reader.close()
        raise
    if c.damaged and recorded < len(steps):
        c.warnings.append(f"trace {reader.path.name}: the recording ends at tick {recorded} of {len(steps)}: it "
                          f"was cut short ({c.damaged}); " + (f"later ticks run on {recompute.name}" if recompute else
                                                              "later ticks need the device that recorded them"))
    return program, timeline, reader


__all__ = ["adopt_partial", "begin", "record", "save", "open_trace", "KIND_NAMES"]
