"""The `trace` driver: a recorded run standing in for the device that made it.

Values come from the trace file. A node whose outputs are only views (transpose, reshape,
slice) is recomputed here with torch, since a view computes nothing; any other value that
the trace does not hold needs the recording device, and asking for it says so — unless the
trace was opened with a real driver to recompute on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import torch
from torch.utils._pytree import tree_map_only

from checkpoint.trace import TraceReader
from hardware.driver import Chip, Driver, MemorySpace, Unit
from hardware.drivers.torch import TorchDriver
from hardware.errors import RewindError
from hardware.memory import Location
from hardware.program import Node, Program


class TraceArchive:
    """The versions a trace holds, loaded on demand."""

    def __init__(self, reader: TraceReader):
        self.reader = reader

    def has(self, key: tuple[str, int]) -> bool:
        return key in self.reader.contents.versions

    def load(self, key: tuple[str, int]) -> Any | None:
        return self.reader.version(*key)


class _LazyInitial(Mapping):
    """Inputs and parameters, each read from the trace when first used."""

    def __init__(self, reader: TraceReader):
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


class TraceDriver(TorchDriver):
    def __init__(self, reader: TraceReader, recompute: Driver | None = None):
        super().__init__(torch.device("cpu"))
        self.reader = reader
        self.recompute = recompute
        meta = reader.contents.meta  # checked by the reader: names are text, locations well formed
        self.name = f"trace of {_printable(meta.get('driver', 'an unknown driver'))}"  # shown, never opened
        self.chip_name = _printable(meta.get("chip", "recorded chip"))
        self.units = [_printable(u) for u in meta.get("units", ["host"])]
        self.recorded_initial_locations = meta.get("initial_locations", {})

    def describe(self) -> Chip:
        return Chip(self.chip_name, tuple(Unit(i, u) for i, u in enumerate(self.units)),
                    (MemorySpace("recorded", 0, 2**64 - 1),))

    def load(self, program: Program) -> Mapping[str, Any]:
        return _LazyInitial(self.reader)

    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if self.recompute is not None:  # the trace's values are host tensors: the recompute device gets copies
            args, kwargs = tree_map_only(torch.Tensor, self.recompute.from_host, (args, kwargs))
            return [self.recompute.to_host(t) for t in self.recompute.execute(node, args, kwargs)]
        if _is_view_op(node):
            return super().execute(node, args, kwargs)
        raise RewindError(
            f"{node.describe()}: its output is not in the trace; recomputing it needs the device that recorded "
            f"it (open the trace with a driver, e.g. driver torch:cpu)")

    def recorded_location(self, name: str) -> Location | None:
        loc = self.recorded_initial_locations.get(name)
        if loc is None:
            return None
        return Location(loc["chip"], loc["unit"], loc["space"], loc["address"], loc["nbytes"], loc["dtype"],
                        tuple(loc["shape"]), tuple(loc["strides"]))


def _printable(name: str) -> str:
    """A name read from a trace, as it may be shown: control characters become '?'."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(name)[:200])


def _is_view_op(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and all(r.alias_info is not None for r in schema.returns)
