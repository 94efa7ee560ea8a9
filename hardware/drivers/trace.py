"""The `trace` driver: a recorded run standing in for the device that made it.

Values come from the recording (read through `hardware.recorded.RecordedRun`: a trace file's reader),
as host tensors. A node whose outputs are only views (transpose, reshape, slice) is recomputed here with
torch, since a view computes nothing; any other value that the trace does not hold needs the recording
device, and asking for it says so — unless the trace was opened with a real driver to recompute on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from hardware import tensor_checks, torch_tensors
from hardware.driver import Chip, Driver, MemorySpace, Unit, WriteStats, from_host, to_host
from hardware.errors import RewindError
from hardware.memory import Location
from hardware.program import Node, Program
from hardware.recorded import RecordedInitial, RecordedRun
from hardware.torch_tensors import TensorBytes

_HOST = torch.device("cpu")


class TraceDriver(TensorBytes, Driver):
    def __init__(self, reader: RecordedRun, recompute: Driver | None = None):
        torch_tensors.keep_freed_memory()  # the ring retains host tensors
        self.device = _HOST
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
        return RecordedInitial(self.reader)

    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if self.recompute is not None:  # the trace's values are host tensors: the recompute device gets copies
            device = self.recompute
            args, kwargs = tree_map_only(torch.Tensor, lambda t: from_host(device, t), (args, kwargs))
            return [to_host(device, t) for t in device.execute(node, args, kwargs)]
        if _is_view_op(node):
            return torch_tensors.run(node, args, kwargs, _HOST)
        raise RewindError(
            f"{node.describe()}: its output is not in the trace; recomputing it needs the device that recorded "
            f"it (open the trace with a driver, e.g. driver torch:cpu)")

    def recorded_location(self, name: str) -> Location | None:
        loc = self.recorded_initial_locations.get(name)
        if loc is None:
            return None
        return Location(loc["chip"], loc["unit"], loc["space"], loc["address"], loc["nbytes"], loc["dtype"],
                        tuple(loc["shape"]), tuple(loc["strides"]))

    # -- the values: host tensors ----------------------------------------------------------------
    def locate(self, tensor: torch.Tensor, unit: str | None = None) -> Location:
        return torch_tensors.locate(tensor, unit or self.describe().units[0].name)

    def inspect(self, tensor: torch.Tensor) -> WriteStats:
        return tensor_checks.inspect(tensor)

    # -- capabilities: HostValues, Precision (a node run again at another precision runs on the host) ----
    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch_tensors.to_host(tensor)

    def from_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch_tensors.from_host(tensor, _HOST)

    def cast(self, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
        return torch_tensors.cast(tensor, dtype)

    def execute_at(self, node: Node, args: tuple, kwargs: dict, dtype: str) -> list[Any]:
        return torch_tensors.run_at(node, args, kwargs, _HOST, dtype)



def _printable(name: str) -> str:
    """A name read from a trace, as it may be shown: control characters become '?'."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(name)[:200])


def _is_view_op(node: Node) -> bool:
    if node.op.startswith(torch_tensors.COLLECTIVE_WAIT):  # returns the collective's result it waited for: an alias
        return True  # its schema does not annotate (a rank's trace holds that result)
    schema = getattr(node.target, "_schema", None)
    return schema is not None and all(r.alias_info is not None for r in schema.returns)
