"""Moving the Session through time, in both directions: continue, step (over, in, out; statement, line,
instruction), goto, restore, restart. Direction is a parameter of every motion, so reverse is not a
second code path: every motion is one scan over positions (`_scan`) that ends in a Stop.

Positions: position p means p steps have run and the node of step p is about to run, as a debugger
stops before a line executes. Position `end` is the end of the program, where the session stays
(stopped, reason "end") so the user can go back. The Timeline does the seeking (checkpoint/timeline.py);
breakpoints and exception filters say where a motion stops (hardware/session/breakpoints.py,
hardware/session/exception_filters.py).
"""

from __future__ import annotations

from typing import Callable

from checkpoint.timeline import Timeline
from hardware.errors import RewindError
from hardware.events import ExceptionDetails, Invalidated, ProgressAfter, Stopped
from hardware.program import Frame
from hardware.session.breakpoints import BreakpointTable
from hardware.session.exception_filters import ExceptionFilters
from hardware.session.instruction_level import InstructionLevel
from hardware.session.state import SessionState
from hardware.ticks import Direction, Stop, Tick

class Motion:
    """The Session's motions: they move its Timeline, and ask its breakpoints, exception filters and (on an
    instruction-stream chip) its instruction level where to stop."""

    def __init__(self, state: SessionState, breakpoints: BreakpointTable, exceptions: ExceptionFilters,
                 instructions: InstructionLevel):
        self.state = state
        self.breakpoints, self.exceptions, self.instructions = breakpoints, exceptions, instructions

    @property
    def tl(self) -> Timeline:
        return self.state.tl

    def start(self) -> Stop:
        """After configuration: stop at entry, or run to the first stop."""
        if self.state.options and self.state.options.stop_on_entry:
            return self.stopped(Stop("entry", self.tl.position, "stopped on entry"))
        return self.run(Direction.FORWARD)

    def pause(self) -> None:
        """Thread-safe: ask the running motion, or the one about to start, to stop at its next tick.

        The request is consumed by the next stop, so a pause that races the start of a motion still stops it."""
        self.state.pause.set()

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
        if self.instructions.cursor is not None:
            if granularity == "instruction":
                return self.instructions.cursor.step_instruction(direction, unit, single_thread)
            if direction is Direction.REVERSE and self.instructions.instruction:  # back to the start of the node we are inside
                return self._scan(direction, lambda q: Stop("step", q) if q == start else None, breakpoints=True)
        if granularity in ("statement", "instruction") and kind != "out":
            target = start + (1 if direction is Direction.FORWARD else -1)
            return self._scan(direction, lambda q: Stop("step", q) if q == target else None)
        frames = self.state.frames_at(start if start < tl.end else tl.end - 1)
        if kind == "out":
            return self._step_out(direction, frames)
        if direction is Direction.REVERSE:
            return self._step_back_line(frames)
        depth = len(frames)

        def done(q: int) -> Stop | None:
            g = self.state.frames_at(q) if q < tl.end else ()
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
                g = self.state.frames_at(q) if q < tl.end else ()
                return Stop("step", q) if depth == 0 or not _same_frame(frames, g, depth) else None
            return self._scan(direction, left, breakpoints=True)
        # Backwards: to the instant before the current frame was entered.
        q = min(tl.position, tl.end - 1)
        while q > 0 and depth and _same_frame(frames, self.state.frames_at(q - 1), depth):
            q -= 1
        target = q if q < tl.position else max(q - 1, 0)
        return self._scan(direction, lambda p: Stop("step", p) if p == target else None, breakpoints=True)

    def _step_back_line(self, frames: tuple[Frame, ...]) -> Stop:
        tl = self.tl
        depth = len(frames)
        q = tl.position - 1
        if tl.position < tl.end and depth:  # skip the earlier nodes of the current line (an edit has none)
            while q >= 0 and _in_line(frames, self.state.frames_at(q), depth):
                q -= 1
        if q < 0:
            return self._scan(Direction.REVERSE, lambda p: Stop("step", p) if p == 0 else None)
        anchor = self.state.frames_at(q)
        if not anchor:  # a user edit has no source line: stepping back undoes just it
            return self._scan(Direction.REVERSE, lambda p: Stop("step", p) if p == q else None, breakpoints=True)
        level = min(depth, len(anchor)) if tl.position < tl.end else len(anchor)
        while q > 0 and _in_line(anchor, self.state.frames_at(q - 1), level):
            q -= 1
        target = q
        return self._scan(Direction.REVERSE, lambda p: Stop("step", p) if p == target else None, breakpoints=True)

    def goto(self, tick: Tick) -> Stop:
        tl = self.tl
        if not 0 <= tick <= tl.end:
            raise RewindError(f"tick {tick} is outside the program (0..{tl.end})")
        tl.seek(tick)
        self.state.on_event(Invalidated())
        return self.stopped(self._end_or(Stop("goto", tick, f"tick {tick}")))

    def restore(self, tick: Tick) -> Stop:
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
        progress = ProgressAfter(self.state.on_event)
        step = 1 if direction is Direction.FORWARD else -1
        inside = self.instructions.instruction  # steps run of the node at q, when stopped inside it
        if step < 0 and inside:
            q += 1  # going back crosses the rest of the node at q first
        first = True
        self.exceptions.start_scan()
        while True:
            if step > 0 and q >= tl.end:
                stop = self.exceptions.late_stop(settle=True) or Stop("end", tl.end, "end of program")
                tl.seek(stop.tick)
                return self.stopped(stop)
            if step < 0 and q <= 0:
                tl.seek(0)
                return self.stopped(Stop("entry", 0, "beginning of the program"))
            if breakpoints and self.instructions.cursor is not None:  # stops inside the node this move crosses
                lo, hi = (inside if first else -1, None) if step > 0 else (-1, inside if first and inside else None)
                crossed = self.instructions.cursor.crossing(q if step > 0 else q - 1, lo, hi, direction)
                if crossed is not None:
                    tl.seek(crossed.tick)
                    return self.stopped(crossed)
            first = False
            q += step
            if step > 0 and q > tl.frontier:
                tl.seek(q)  # executes the step and records it
            stop = stop_at(q)
            if stop is None and breakpoints:
                stop = self.breakpoints.stop_at(q, direction) or self.exceptions.stop_at(q, direction)
            if stop is None and self.state.pause.is_set():
                stop = Stop("pause", q, "paused")
            late = self.exceptions.late_stop(settle=stop is not None)
            if late is not None and (stop is None or late.tick < stop.tick):
                stop, q = late, late.tick
            if stop is not None:
                tl.seek(q)
                return self.stopped(self._end_or(stop))
            if q % 64 == 0:
                progress(f"tick {q} of {tl.end}", q, tl.end)

    def _end_or(self, stop: Stop) -> Stop:
        if stop.tick == self.tl.end and stop.reason in ("step", "goto"):
            return Stop("end", stop.tick, "end of program")
        return stop

    def stopped(self, stop: Stop) -> Stop:
        self.state.pause.clear()
        self.state.last_stop = stop
        if self.instructions.cursor is not None:
            self.instructions.cursor.place(stop.tick, stop.instruction or 0)
        self.state.on_event(Stopped(stop.reason, stop.description, tuple(stop.breakpoint_ids),
                              stop.unit if self.instructions.cursor is not None else None))
        return stop

    def exception_info(self) -> ExceptionDetails:
        stop = self.state.last_stop
        if stop is None or stop.exception is None:
            raise RewindError("not stopped on an exception")
        return stop.exception


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
