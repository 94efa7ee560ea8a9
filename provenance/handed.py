"""The Session as the analyses see it: what they are handed, never what they import.

The analyses (forensics, experiments, problems, repair, validation, ...) sit below the Session
(hardware/session/): the Session builds them and hands itself over. They are typed against these
Protocols, which list only what they use of it; `hardware.session.Session` (and its `LaunchOptions`)
satisfy them structurally, and a surface that needs to construct a Session imports it from there.

An analysis that needs the Session's own analyses (`session.forensics`, `session.experiments`)
types against the Protocol extended next to the analysis it names: `WithForensics` in
provenance/forensics.py, `WithExperiments` in provenance/experiments.py.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol

from checkpoint.timeline import Timeline
from hardware.events import ExceptionDetails, SessionEvent
from hardware.program import Program
from hardware.ticks import Direction, Stop, Tick


class LaunchSettings(Protocol):
    """How the handed Session's pass was launched (`hardware.session.LaunchOptions`), as far as analyses read it."""

    @property
    def program(self) -> str: ...  # the model file
    @property
    def entry(self) -> str: ...  # the function in it that builds the model and its inputs
    @property
    def driver(self) -> str: ...
    @property
    def budget_mb(self) -> float: ...  # the device tier of the checkpoint ring
    @property
    def trace(self) -> str | None: ...  # the pass is a recording opened from this file
    @property
    def reference(self) -> str | None: ...  # forensics: the reference spec (None: the default)
    @property
    def rtol(self) -> float | None: ...
    @property
    def atol(self) -> float | None: ...

    def driver_options(self) -> dict: ...


class SessionView(Protocol):
    """A launched Session, as the analyses use it: its pass, its events, its values, its motion."""

    @property
    def tl(self) -> Timeline: ...  # the pass's Timeline (the only thing that seeks)
    @property
    def program(self) -> Program: ...  # loaded: analyses are handed a launched Session
    @property
    def options(self) -> LaunchSettings | None: ...
    @property
    def on_event(self) -> Callable[[SessionEvent], None]: ...  # where the analyses' progress goes
    @property
    def position(self) -> Tick: ...

    # values
    def value_stats(self, name: str, position: int | None = None) -> dict: ...
    def tensor(self, name: str, position: int | None = None) -> Any: ...
    def source_names(self, position: int | None = None, level: int = 0) -> dict[str, str]: ...
    def nonfinite_at(self, tick: int, filters: Iterable[str] = ("nan", "inf")) -> ExceptionDetails | None: ...

    # motion and exception filters (problems.py walks the recorded schedules with them)
    @property
    def exception_filters(self) -> set[str]: ...
    def set_exception_filters(self, filters: Iterable[str]) -> None: ...
    def run(self, direction: Direction = Direction.FORWARD) -> Stop: ...
    def goto(self, tick: int) -> Stop: ...
