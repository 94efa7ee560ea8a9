"""Saving a Timeline to a trace, recording one continuously, and opening one again."""

from __future__ import annotations

from typing import Any, Callable

from checkpoint.codec import decode_program, encode_program
from checkpoint.ring import Checkpoint
from checkpoint.timeline import INITIAL, Edit, Step, Timeline
from checkpoint.trace import TraceReader, TraceWriter
from hardware.driver import Driver
from hardware.program import Program
from provenance.writelog import KIND_NAMES, KIND_VIEW


def begin(writer: TraceWriter, program: Program, driver: Driver, initial: dict[str, Any]) -> None:
    """The frames every trace starts with: what ran where, the Program with its sources, the inputs."""
    chip = driver.describe()
    writer.meta(driver=driver.name, chip=chip.name, units=[u.name for u in chip.units],
                initial_locations={n: driver.locate(t).to_dict() for n, t in initial.items()})
    writer.program(encode_program(program))
    for name, tensor in initial.items():
        writer.initial(name, tensor)


def record(timeline: Timeline, path: str) -> TraceWriter:
    """Start continuous recording: every step, write and written value from now on goes to `path`."""
    writer = TraceWriter(path)
    begin(writer, timeline.program, timeline.driver, _initial_contents(timeline))
    timeline.recorder = writer
    return writer


def save(timeline: Timeline, path: str, progress: Callable[[int, int], None] | None = None) -> TraceWriter:
    """Write everything the Timeline recorded so far; evicted values are recomputed to be saved."""
    writer = TraceWriter(path)
    begin(writer, timeline.program, timeline.driver, _initial_contents(timeline))
    log = timeline.log
    rows_by_tick: dict[int, list[int]] = {}
    for i in range(len(log)):
        rows_by_tick.setdefault(log.row(i)[0], []).append(i)
    for tick in range(timeline.frontier):
        step = timeline.schedule[tick]
        writer.step(tick, step.unit, step.node, _edit(step))
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
    writer.close()
    return writer


def _initial_contents(timeline: Timeline) -> dict[str, Any]:
    """Initial values as they were at tick 0 (a mutated buffer's pre-image, not its current memory)."""
    return {name: timeline.value_version(name, INITIAL) for name in timeline.initial}


def _edit(step: Step) -> dict | None:
    e = step.edit
    return None if e is None else {"value": e.value, "offset": e.offset, "data": e.data, "description": e.description}


def open_trace(path: str, make_timeline: Callable[[Program, Driver, Any], Timeline],
               recompute: Driver | None = None) -> tuple[Program, Timeline, TraceReader]:
    """Rebuild the Program and a Timeline positioned at tick 0 whose recorded steps come from the trace."""
    from hardware.drivers.trace import TraceArchive, TraceDriver, _LazyInitial

    reader = TraceReader(path)
    c = reader.contents
    initial = _LazyInitial(reader)
    program = decode_program(c.program, initial)
    driver = TraceDriver(reader, recompute)
    timeline = make_timeline(program, driver, TraceArchive(reader))
    recorded = _complete_steps(program, c.steps, c.writes)
    steps = []
    for tick, unit, node, edit in recorded:
        steps.append(Step(int(unit), node, Edit(edit["value"], int(edit["offset"]), bytes(edit["data"]),
                                                edit.get("description", "")) if edit else None))
    ran = {s.node for s in steps if s.node is not None}
    steps += [Step(0, n.index) for n in program.nodes if n.index not in ran]
    timeline.schedule = steps
    timeline.node_tick = [0] * len(program.nodes)
    for tick, step in enumerate(steps):
        if step.node is not None:
            timeline.node_tick[step.node] = tick
    for row in c.writes:
        if row[0] >= len(recorded):
            continue
        timeline.log.append_row(row)
        timeline.versions.setdefault(row[3], [INITIAL] if row[3] in timeline.initial else []).append(int(row[0]))
    timeline.frontier = len(recorded)
    for tick, pins in c.checkpoints:
        timeline.ring.checkpoints[int(tick)] = Checkpoint(int(tick), frozenset((p[0], int(p[1])) for p in pins),
                                                          "trace", thinned=True)
    return program, timeline, reader


def _complete_steps(program: Program, steps: list, writes: list) -> list:
    """The recorded steps up to the first whose writes did not all reach the file (a killed recording
    can end between a step's frame and its writes' frames)."""
    written: dict[int, set] = {}
    for row in writes:
        written.setdefault(int(row[0]), set()).add(row[3])
    for i, (tick, _unit, node, edit) in enumerate(steps):
        expected = {edit["value"]} if edit else set(program.nodes[node].outputs)
        if not expected <= written.get(int(tick), set()):
            return steps[:i]
    return steps


__all__ = ["begin", "record", "save", "open_trace", "KIND_NAMES"]
