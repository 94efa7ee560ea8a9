"""A recorded run, as the code that stands in for its device reads it.

A trace (checkpoint/trace.py) is read by the time floor; the trace driver, which replays it in the
device's place, sees it only through `RecordedRun`, the little it needs: the recording's meta (what ran
where), which initial values and versions it holds, and those tensors on demand. checkpoint/trace.py's
TraceReader is one, structurally. Whoever opens a trace builds its driver with a `TraceDriverFactory`
(the registry's `hardware.drivers.trace_driver`) and hands it to `checkpoint.recording.open_trace`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from hardware.driver import Driver


class RecordedContents(Protocol):
    """What opening a recording read, checked: every name and tick in it is one the recording holds."""

    @property
    def meta(self) -> Mapping[str, Any]:
        """driver, chip, units, initial_locations: as the recording device described itself."""

    @property
    def initial(self) -> Mapping[str, Any]:
        """The inputs, parameters, buffers and constants the recording holds, by name."""

    @property
    def versions(self) -> Mapping[tuple[str, int], Any]:
        """The written values it holds, by (value name, tick)."""


class RecordedRun(Protocol):
    @property
    def contents(self) -> RecordedContents: ...

    def initial_value(self, name: str) -> Any | None:
        """The initial contents of `name` as a host tensor; None if the recording holds none."""

    def version(self, name: str, tick: int) -> Any | None:
        """`name` as written at `tick`, as a host tensor; None if the recording does not hold it."""


# A recording and, optionally, a real driver to recompute what it does not hold -> the driver standing in.
TraceDriverFactory = Callable[[RecordedRun, Driver | None], Driver]


class RecordedInitial(Mapping[str, Any]):
    """Inputs and parameters of a recording, each read when first used."""

    def __init__(self, reader: RecordedRun):
        self.reader = reader
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded:
            if name not in self.reader.contents.initial:
                raise KeyError(name)  # the Mapping protocol: `in` and .get() rely on it
            self._loaded[name] = self.reader.initial_value(name)
        return self._loaded[name]

    def __setitem__(self, name: str, tensor: Any) -> None:
        self._loaded[name] = tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.reader.contents.initial)

    def __len__(self) -> int:
        return len(self.reader.contents.initial)
