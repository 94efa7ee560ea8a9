"""Moving the Session through time, in both directions: continue, step (over, in, out; by statement, that is a
source line, or by instruction), step into a node of the current line, goto, restore, restart. Direction is a
parameter of every motion, so reverse is not a second code path: every motion is one scan over positions (`_scan`)
that ends in a Stop.

Stepping by statement is gdb's: `next` and `back` step over calls in both directions, and a step that stops on a
line of a caller before the call's first node runs (the call line) shows the stack out to that caller (Stop.depth),
since that instant is also the callee's first line; `stepIn` there enters the call without moving.

Positions: position p means p steps have run and the node of step p is about to run, as a debugger
stops before a line executes. In a training Program time is also (training step, tick): every stop's description
says both, and `goto_step` goes to the first node of a step; a line's backward is an execution of the line of its
own, after its forward. Position `end` is the end of the program, where the session stays
(stopped, reason "end") so the user can go back. The Timeline does the seeking (checkpoint/timeline.py);
breakpoints and exception filters say where a motion stops (hardware/session/breakpoints.py,
hardware/session/exception_filters.py).
"""

from __future__ import annotations

from typing import Callable

from checkpoint.timeline import Timeline
from hardware.errors import RewindError, echo
from hardware.events import ExceptionDetails, Invalidated, ProgressAfter, Stopped
from hardware.line_executions import LineExecutions
from hardware.program import Frame
from hardware.session.breakpoints import BreakpointTable
from hardware.session.exception_filters import ExceptionFilters
from hardware.session.fast_forward import FastForward
from hardware.session.instruction_level import InstructionLevel
from hardware.session.state import SessionState, after_write
from hardware.ticks import Direction, Stop, Tick

GRANULARITIES = ("statement", "line", "instruction")  # statement and line are one thing: a line of Python source
MAX_STEP_IN_TARGETS = 1000

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
        here = self.breakpoints.stop_at(self.tl.position, Direction.FORWARD) if self.breakpoints.verified() else None
        return self.stopped(here) if here is not None else self.run(Direction.FORWARD)  # a breakpoint where it starts

    def after_edit(self, value: str) -> Stop:
        """An edit is a step (the position moves past it): the stop it leaves, for the client to show."""
        return self.stopped(self._end_or(Stop("step", self.tl.position, f"after the edit of {value}")))

    def pause(self) -> None:
        """Thread-safe: ask the running motion, or the one about to start, to stop at its next tick.

        The request is consumed by the next stop, so a pause that races the start of a motion still stops it."""
        self.state.pause.set()

    def run(self, direction: Direction = Direction.FORWARD) -> Stop:
        """Continue (or reverse-continue) to the next position where a breakpoint holds."""
        return self._scan(direction, lambda q: None, breakpoints=True)

    def step(self, direction: Direction = Direction.FORWARD, granularity: str = "statement",
             kind: str = "over", unit: int | None = None, single_thread: bool = False) -> Stop:
        """One step: kind over (next), in (stepIn), out (stepOut).

        Granularity `statement` (or `line`, the same): a line of source, as gdb steps: over calls both ways; back from
        inside a line to where it began, from where it began to where the line before it in the same function began,
        and from a function's first line to its call line. `instruction`: one node; on a chip whose nodes run as
        instruction streams, one step of the node's interleaving: of any unit, of `unit` (the others run as
        recorded), or of `unit` alone (`single_thread`). On a unit whose instructions have lines of their own (a
        kernel's program), `statement` over or in is a line of that code: the unit to the next line it executes, or
        back to where the line began (InstructionCursor.step_line); the `host` thread steps lines of the Program.
        Breakpoints met on the way stop a step early, as in gdb."""
        if granularity not in GRANULARITIES:
            raise RewindError(f"unknown stepping granularity '{granularity}': statement (a line of source, the "
                              "default), line (the same) or instruction (one node; one chip instruction on a chip "
                              "whose nodes run as instruction streams)")
        tl = self.tl
        start = tl.position
        cursor = self.instructions.cursor
        if granularity == "instruction" and cursor is not None:
            return cursor.step_instruction(direction, unit, single_thread)
        if kind != "out" and unit and cursor is not None and cursor.steps_lines(unit):  # a kernel program's lines
            return cursor.step_line(direction, unit, single_thread)
        if self.instructions.cursor is None and self.state.stopped_after_write():
            return self._from_writer(direction, kind)
        if granularity == "instruction" and kind != "out":  # one node
            target = start + (1 if direction is Direction.FORWARD else -1)
            return self._scan(direction, lambda q: Stop("step", q) if q == target else None)
        frames = self.state.shown_frames(min(start, tl.end - 1))
        if kind == "out":
            return self._step_out(direction, frames)
        if direction is Direction.REVERSE:
            return self._step_back(frames)
        if start < tl.end and kind == "in" and len(frames) < len(self.state.frames_at(start)):
            return self._stay(len(frames) + 1)  # into the call of this call line, before it runs
        return self._scan(direction, self._over(frames) if kind == "over" else self._into(frames), breakpoints=True)

    def _from_writer(self, direction: Direction, kind: str) -> Stop:
        """A step from a stop right after a write (a data breakpoint, a NaN, an Inf, a divergence), whose top frame
        is the writer, which has run (SessionState.stopped_after_write): forward, the next node is about to run
        (no motion); back, the instant before the write; out, out of the writer's frame."""
        tl, start = self.tl, self.tl.position
        if kind == "out":
            frames = self.state.frames_at(start - 1)
            if direction is Direction.FORWARD and frames and (start >= tl.end or not _same_frame(
                    frames, self.state.frames_at(start), len(frames))):
                return self.stopped(self._end_or(Stop("step", start)))  # the next node is outside it already
            return self._step_out(direction, frames)
        if direction is Direction.FORWARD:
            return self.stopped(self._end_or(Stop("step", start)))
        return self._scan(direction, lambda q: Stop("step", q) if q == start - 1 else None, breakpoints=True)

    def _over(self, frames: tuple[Frame, ...]) -> Callable[[int], Stop | None]:
        """Where `next` stops: where the line frames[-1] is at stops running (over the calls it makes)."""
        depth, end = len(frames), self.tl.end

        def done(q: int) -> Stop | None:
            if depth and q < end and self._continues(frames, q - 1, q, depth):
                return None
            g = self.state.frames_at(q) if q < end else ()
            return Stop("step", q, depth=self._shown(q, _common_depth(frames, g, depth)))
        return done

    def _into(self, frames: tuple[Frame, ...]) -> Callable[[int], Stop | None]:
        """Where `stepIn` stops: at the next line of any frame, shown at the frame whose line it is: a callee's
        first line, the next line of this function, or, once this function has returned, the caller's line."""
        keys, end = _keys(frames), self.tl.end

        def done(q: int) -> Stop | None:
            g = self.state.frames_at(q) if q < end else ()
            other = _keys(g)
            if other == keys:
                return None
            changed = next((i for i, (a, b) in enumerate(zip(keys, other)) if a != b), min(len(keys), len(other)))
            left = changed < min(len(keys), len(other)) and not _same_frame(frames, g, changed + 1)
            return Stop("step", q, depth=self._shown(q, changed if left else changed + 1))
        return done

    def _step_out(self, direction: Direction, frames: tuple[Frame, ...]) -> Stop:
        depth = len(frames)
        tl = self.tl
        if direction is Direction.FORWARD:
            def left(q: int) -> Stop | None:
                g = self.state.frames_at(q) if q < tl.end else ()
                if depth and _same_frame(frames, g, depth):
                    return None
                return Stop("step", q, depth=self._shown(q, _common_depth(frames, g, depth)))
            return self._scan(direction, left, breakpoints=True)
        # Backwards (gdb's reverse-finish): to the call line in the caller, at the instant the frame was entered.
        if not depth:  # from a user edit, which is a step of its own
            return self._back_to(max(tl.position - 1, 0), None)
        q = min(tl.position, tl.end - 1)
        while q > 0 and _same_frame(frames, self.state.frames_at(q - 1), depth):
            q -= 1
        return self._back_to(q, depth - 1)

    def _step_back(self, frames: tuple[Frame, ...]) -> Stop:
        """`next` backwards, as gdb's reverse-next: over calls, to the start of a line in the same function or in
        its caller (see `step`)."""
        tl = self.tl
        p, depth = tl.position, len(frames)
        if p >= tl.end or not depth:  # from the end, or from a user edit: to where the line of the step before began
            q = min(p, tl.end) - 1
            if q < 0:
                return self._scan(Direction.REVERSE, lambda _: None)
            anchor = self.state.frames_at(q)
            return self._back_to(self._line_start(q, anchor, len(anchor)) if anchor else q, None)
        begun = self._line_start(p, frames, depth)
        if begun < p or self.instructions.instruction:  # inside the line: to where it began
            return self._back_to(begun, depth)
        if p == 0:
            return self._scan(Direction.REVERSE, lambda _: None)
        before = self.state.frames_at(p - 1)
        if not before:  # a user edit has no source line: stepping back undoes just it
            return self._back_to(p - 1, None)
        if _same_frame(frames, before, depth):  # the line before, in this function, over the calls it made
            return self._back_to(self._line_start(p - 1, before, depth), depth)
        if depth == 1:
            return self._back_to(self._line_start(p - 1, before, len(before)), None)
        # the function's first line: to the call line in the caller, where its execution began
        return self._back_to(self._line_start(p, frames, depth - 1), depth - 1)

    def _back_to(self, target: Tick, depth: int | None) -> Stop:
        """Step back to `target` (breakpoints on the way stop it), showing `depth` frames there."""
        if target == self.tl.position and not self.instructions.instruction:
            return self._stay(depth)
        return self._scan(Direction.REVERSE,
                          lambda q: Stop("step", q, depth=self._shown(q, depth)) if q == target else None,
                          breakpoints=True)

    def _stay(self, depth: int | None) -> Stop:
        """A step that needs no motion, only another frame shown: into the call of a call line, or back from a
        function's first line to its call line (one instant: before the call's first node runs)."""
        tick = self.tl.position
        return self.stopped(Stop("step", tick, depth=self._shown(tick, depth),
                                 instruction=self.instructions.instruction or None))

    def _shown(self, tick: Tick, depth: int | None) -> int | None:
        """`depth` frames at `tick` (None: all of them, which is what a depth as deep as the node's is)."""
        if depth is None or tick >= self.tl.end or not 0 < depth < len(self.state.frames_at(tick)):
            return None
        return depth

    def _continues(self, frames: tuple[Frame, ...], a: Tick, b: Tick, depth: int) -> bool:
        """Do ticks a and b = a + 1 run one execution of the line frames[depth - 1] is at (or calls it makes)?

        A loop over layers runs its line once per layer (line_executions.py; breakpoints and goto targets count
        executions the same way)."""
        fa, fb = self.state.frames_at(a), self.state.frames_at(b)
        if not (_in_line(frames, fa, depth) and _in_line(frames, fb, depth)):
            return False
        na, nb = self.tl.node_at(a), self.tl.node_at(b)  # nodes with frames: no edit
        return na.phase == nb.phase and not LineExecutions.of(self.state.program).begins(fa, nb, depth - 1)

    def _line_start(self, q: Tick, frames: tuple[Frame, ...], depth: int) -> Tick:
        """Where the execution of the line frames[depth - 1] is at, which tick q runs, began."""
        while q > 0 and self._continues(frames, q - 1, q, depth):
            q -= 1
        return q

    def step_in_targets(self, level: int | None = 0) -> list[Tick]:
        """The nodes still to run in the current execution of the line of stack frame `level` (0 = innermost as
        shown; None = outermost, whose targets include every frame's), by tick: where `step_into` can go. Right
        after a write the Session stopped for, the stack shows the writer, and the node about to run is the first
        target when it runs the writer's line on. At most MAX_STEP_IN_TARGETS, the first ones (each frame's
        targets are the first ones of the outermost's)."""
        tl, p = self.tl, self.tl.position
        if self.instructions.cursor is None and self.state.stopped_after_write():
            frames, q = self.state.frames_at(p - 1), p
        else:
            frames, q = (self.state.shown_frames(p) if p < tl.end else ()), p + 1
        if not frames:  # the end, or a user edit: no line runs
            return []
        level = len(frames) - 1 if level is None else level
        if not 0 <= level < len(frames):
            raise RewindError(f"no frame {level} here: the stack has {len(frames)} frame(s)")
        depth, out = len(frames) - level, []
        while q < tl.end and len(out) < MAX_STEP_IN_TARGETS and self._continues(frames, q - 1, q, depth):
            out.append(Tick(q))
            q += 1
        return out

    def step_into(self, tick: Tick) -> Stop:
        """Run forward to the instant before the node at `tick` runs, one of `step_in_targets`; breakpoints on the
        way stop it first. One node at a time, on any chip: the first target is the next node of the line."""
        if tick not in self.step_in_targets(None):
            raise RewindError(f"tick {tick} is not a node still to run on the line at tick {self.tl.position}: "
                              "step into one of the targets listed here")
        if tick == self.tl.position:  # after a write: the node about to run, shown instead of the writer
            return self._stay(None)
        return self._scan(Direction.FORWARD, lambda q: Stop("step", q) if q == tick else None, breakpoints=True)

    def goto(self, tick: Tick, description: str | None = None) -> Stop:
        tl = self.tl
        if not 0 <= tick <= tl.end:
            raise RewindError(f"tick {tick} is outside the program (0..{tl.end})")
        tl.run_ahead(tick)  # nothing stops a goto on its way
        tl.seek(tick)
        self.state.on_event(Invalidated())
        return self.stopped(self._end_or(Stop("goto", tick, description or f"tick {tick}")))

    def step_start(self, step: int) -> Tick:
        """The tick where training step `step` (from 0) starts: its first node is about to run there."""
        program = self.state.program
        count = len(program.step_starts) if program is not None else 0
        if not count:
            raise RewindError("this program is one inference pass, with no training steps: launch a training step "
                              "(entry train_step, steps N) to go to one")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < count:
            shown = step if isinstance(step, int) and not isinstance(step, bool) else f"'{echo(str(step))}'"
            raise RewindError(f"step {shown} is not a step of this run: its steps are 0..{count - 1}")
        return self.state.step_start(step)

    def goto_step(self, step: int) -> Stop:
        """To the start of training step `step` (from 0), before its first node runs."""
        return self.goto(self.step_start(step), f"start of step {step}")

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
        # Breakpoints change only between motions: a scan with none set asks none of them at each position.
        holding = breakpoints and bool(self.breakpoints.verified())
        fast = FastForward(self.state, self.breakpoints, self.exceptions, self.instructions, holding)
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
                fast.ahead(q)  # executes the step (and those after it no stop can come before) and records it
            stop = stop_at(q)
            if stop is None and breakpoints:
                stop = (holding and self.breakpoints.stop_at(q, direction)) or self.exceptions.stop_at(q, direction)
            if stop is None and self.state.pause.is_set():
                stop = Stop("pause", q, "paused")
            late = self.exceptions.late_stop(settle=stop is not None)
            if late is not None and (stop is None or late.tick < stop.tick):
                stop, q = late, late.tick
            if stop is not None:
                fast.settle(q)
                tl.seek(q)
                return self.stopped(self._end_or(stop))
            if q % 64 == 0:
                progress(f"tick {q} of {tl.end}", q, tl.end)

    def _end_or(self, stop: Stop) -> Stop:
        if stop.tick == self.tl.end and stop.reason in ("step", "goto"):
            return Stop("end", stop.tick, "end of program")
        return stop

    def stopped(self, stop: Stop) -> Stop:
        step = self.state.step_of(stop.tick - 1 if after_write(stop) and stop.tick else stop.tick)
        if step is not None:
            stop.description = f"{stop.description or stop.reason} (step {step}, tick {stop.tick})"
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


def _common_depth(frames: tuple[Frame, ...], other: tuple[Frame, ...], depth: int) -> int:
    """How many of frames[:depth] (outermost first) `other` is still inside: the frame a step lands in."""
    return next((k for k in range(depth, 0, -1) if _same_frame(frames, other, k)), 0)
