"""Fast-forward: how far a forward motion may run the pass ahead of the positions it looks at.

A forward motion looks at positions one by one (motion.py's scan), and each step it has not run yet must run before
it can look. Where no stop can come before a position, the steps up to it run as one stretch
(`Timeline.run_ahead`): with the Session's `fast_forward` (the default) they keep only their write log rows (the fused
checks: digest, NaN/Inf counts, min/max/sum) and the values later steps read, the ring retaining what each checkpoint
needs; any other value is recomputed from the checkpoint before it when it is asked for, as rr replays.

Where a stop can come is known before running, from the Program: the positions of line and function breakpoints
(their conditions, hit counts and log points are looked at as the scan reaches them). What only the run can say
(a data breakpoint's writes, a NaN or an Inf, a loss spike, a pause, where a `next` ends) is looked at after the
stretch ran, from its write log rows, position by position: a stretch that ran past such a stop ran steps the user
then steps back over, never a stop missed. Stretches start at one step and double up to MAX_AHEAD, so a motion that
stops soon runs little past its stop. Not run ahead: a chip whose nodes run as instruction streams (its stops are
inside nodes) and the `divergence` filter (it compares every value as it is written).
"""

from __future__ import annotations

from hardware.session.breakpoints import BreakpointTable
from hardware.session.exception_filters import ExceptionFilters
from hardware.session.instruction_level import InstructionLevel
from hardware.session.state import SessionState
from hardware.ticks import Tick

MAX_AHEAD = 256  # steps a stretch runs at most: a pause waits for the end of one


class FastForward:
    """The stretches of one forward motion: each call of `ahead` runs the next one."""

    def __init__(self, state: SessionState, breakpoints: BreakpointTable, exceptions: ExceptionFilters,
                 instructions: InstructionLevel, holding: bool):
        self.state, self.breakpoints = state, breakpoints
        self.holding = holding  # the motion asks breakpoints at each position
        self.on = (state.tl.fast_forward and instructions.cursor is None and "divergence" not in exceptions.filters)
        self.stretch = 1
        self.began = state.tl.frontier  # what had run when the motion began

    def ahead(self, q: Tick) -> None:
        """Run the steps before position q that have not run, and as many after as can run before a stop can come."""
        tl = self.state.tl
        if not self.on:
            tl.seek(q)
            return
        stop = min(tl.end, q - 1 + self.stretch)
        if self.holding:
            first = self.breakpoints.next_position(q)
            stop = stop if first is None else min(stop, first)
        try:
            tl.run_ahead(Tick(max(stop, q)))
        except Exception:  # noqa: BLE001 - a step that fails fails where the motion reaches it, as node by node
            self.on = False  # the positions before it are looked at first: a stop there comes before the failure
            if tl.frontier < q:
                tl.seek(q)
        self.stretch = min(2 * self.stretch, MAX_AHEAD)

    def settle(self, q: Tick) -> None:
        """The motion stops at position q: the steps its stretches ran past q are forgotten, so the run stands where
        node by node leaves it (a trace saved, a collective a rank ran, an edit's future: the same)."""
        tl = self.state.tl
        if tl.frontier > max(q, self.began):
            tl.forget_ahead(Tick(max(q, self.began)))
