"""What the Session reports as it works, in its own vocabulary (dap_server/events.py turns it into DAP).

Each event is a small record of its own kind; a surface translates the kinds it knows. Work that may take
long reports its progress through `ProgressAfter`, which stays silent until the work has run half a second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Union

PROGRESS_DELAY_S = 0.5  # work reports progress once it has run this long (a quick step stays quiet)


@dataclass(frozen=True)
class Output:
    """Words for the user: a warning, a note about the recording, a finding said in words."""

    kind: ClassVar[str] = "output"
    text: str
    level: str = "important"  # important: shown prominently; log: the session's log; error: a failure;
    # stdout: what the program printed (a rank's, hardware/ranks/session.py)


@dataclass(frozen=True)
class Progress:
    kind: ClassVar[str] = "progress"
    message: str
    percentage: float | None = None


@dataclass(frozen=True)
class Stopped:
    """A motion ended (the Stop it ended in is the Session's `last_stop`)."""

    kind: ClassVar[str] = "stopped"
    reason: str
    description: str = ""
    breakpoint_ids: tuple[int, ...] = ()
    unit: int | None = None  # the unit the stop is about (a race's second access, a hung unit)


@dataclass(frozen=True)
class Invalidated:
    """What the user was shown is out of date: values (and the frames they hang from) changed in place."""

    kind: ClassVar[str] = "invalidated"
    values: bool = True
    frames: bool = True


@dataclass(frozen=True)
class RecordingStarted:
    """A continuous recording began: it is written to `partial` and moved onto `target` when it ends."""

    kind: ClassVar[str] = "recording"
    partial: str
    target: str
    overwrite: bool


@dataclass(frozen=True)
class Nondeterminism:
    """Replay wrote bytes other than the recorded ones (also said in words by an Output)."""

    kind: ClassVar[str] = "nondeterminism"
    tick: int
    node: str
    value: str


SessionEvent = Union[Output, Progress, Stopped, Invalidated, RecordingStarted, Nondeterminism]


class ProgressAfter:
    """The progress of one piece of work, reported only once it has run PROGRESS_DELAY_S."""

    def __init__(self, emit: Callable[[SessionEvent], None], delay: float = PROGRESS_DELAY_S):
        self._emit, self._delay = emit, delay
        self._started = time.monotonic()

    @property
    def due(self) -> bool:
        return time.monotonic() - self._started > self._delay

    def __call__(self, message: str, done: int, total: int) -> None:
        if self.due:
            self._emit(Progress(message, 100.0 * done / max(total, 1)))


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
    context: str = ""  # where in a training step the write was: "in the backward of log" (none in a forward)

    def description(self) -> str:
        where = f" at {self.source}" if self.source else ""
        if self.filter in ("race", "hang", "access", "loss-spike", "replicas"):  # a chip's, a training run's, ranks'
            return self.evidence["message"]
        if self.filter == "divergence" and "message" in self.evidence:  # a chip's own (a kernel's, at its store)
            return self.evidence["message"]
        if self.filter == "divergence":
            return (f"'{self.value}' diverges from the reference at {self.count} element(s): "
                    f"{self.op} ('{self.node}'){where} introduced the error")
        what = "NaN" if self.filter == "nan" else "Inf"
        context = f", {self.context}" if self.context else ""
        return f"{self.count} {what} written to '{self.value}' by {self.op} ('{self.node}')" + where + context
