"""Time's vocabulary: a Tick, the Direction of a motion, and the Stop a motion ends in.

Position p means p steps have run and the step at tick p is about to run, as a debugger stops before a
line executes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import NewType

from hardware.events import ExceptionDetails

Tick = NewType("Tick", int)  # the global step counter: one executed step of one unit


class Direction(Enum):
    FORWARD = "forward"
    REVERSE = "reverse"


@dataclass
class Stop:
    reason: str  # entry, step, breakpoint, function breakpoint, data breakpoint, exception, pause, goto, end
    tick: Tick
    description: str = ""
    breakpoint_ids: list[int] = field(default_factory=list)
    exception: ExceptionDetails | None = None
    instruction: int | None = None  # steps of the node at `tick` that have run (instruction granularity)
    unit: int | None = None  # the unit the stop is about (a race's second access, a hung unit)
    depth: int | None = None  # source frames the stop shows, outermost first (a step that stops on a call line in
    # a caller, before the call's first node runs); None: every frame of the node at `tick`
