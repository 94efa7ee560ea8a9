"""The driver contract: the only code that touches a chip.

A new chip is one file in drivers/ implementing `Driver`. It is about the size of tinygrad's
Allocator + Program pair: describe the chip, load a Program, run one step, report where its
outputs live, check them on the device, and read/write bytes.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from hardware.errors import DriverError
from hardware.memory import Location
from hardware.program import Node, Program


@dataclass(frozen=True)
class Unit:
    id: int
    name: str
    gang: int | None = None


@dataclass(frozen=True)
class MemorySpace:
    name: str
    base: int
    size: int


@dataclass(frozen=True)
class Chip:
    name: str
    units: tuple[Unit, ...]
    spaces: tuple[MemorySpace, ...]


@dataclass(frozen=True)
class WriteStats:
    """What the device computed about one written value, without copying it off the device."""

    digest: int
    nan: int
    inf: int
    min: float
    max: float
    mean: float

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0

    @staticmethod
    def empty() -> "WriteStats":
        return _NO_STATS


_NO_STATS = WriteStats(0, 0, 0, math.nan, math.nan, math.nan)  # frozen: one for every write without stats


class ChecksReadback:
    """A batch of on-device checks on its way to the host (`Driver.read_checks`); this one has arrived."""

    def __init__(self, stats: list[WriteStats]):
        self._stats = stats

    def ready(self) -> bool:
        return True

    def stats(self) -> list[WriteStats]:
        """The batch's stats in the order of its checks (waiting for them if they are still on their way)."""
        return self._stats


class Driver(ABC):
    """One chip. All methods run on the session's worker thread."""

    name: str
    check_batch = 1  # writes whose checks a Timeline reads back together (1: each one as it is written)
    pools_checkpoints = False  # whether the ring copies retained versions into `checkpoint_pool` by default
    on_report: Callable[[str], None] | None = None  # what the driver tells the user (the Session shows it)

    @abstractmethod
    def describe(self) -> Chip: ...

    @abstractmethod
    def load(self, program: Program) -> dict[str, Any]:
        """Check every op is supported (raise UnsupportedOpError naming them) and place the
        Program's initial values on the device. Returns value name -> device tensor."""

    @abstractmethod
    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        """Run one node on the device; return its outputs in `node.outputs` order."""

    @abstractmethod
    def locate(self, tensor: Any, unit: str | None = None) -> Location:
        """Where a device tensor's elements live."""

    @abstractmethod
    def inspect(self, tensor: Any) -> WriteStats:
        """Digest, NaN/Inf counts and min/max/mean, computed on the device."""

    @abstractmethod
    def read(self, tensor: Any, offset: int, count: int) -> bytes:
        """Bytes of the tensor's storage from its first element + offset."""

    @abstractmethod
    def write(self, tensor: Any, offset: int, data: bytes) -> None:
        """Overwrite bytes of the tensor's storage in place."""

    @abstractmethod
    def copy_into(self, dst: Any, src: Any) -> None:
        """Overwrite dst's elements with src's (same shape): the physical write of a buffer."""

    @abstractmethod
    def clone(self, tensor: Any) -> Any:
        """A private copy (a pre-image) of a device tensor."""

    # -- precision: the reference pass and precision patches run nodes wider than the Program says --
    def execute_at(self, node: Node, args: tuple, kwargs: dict, dtype: str) -> list[Any]:
        """Run one node with its floating-point arithmetic in `dtype`: floating inputs and dtype
        arguments are widened to it (casts to a lower precision become no-ops) and so are its outputs."""
        raise DriverError(f"driver {self.name} cannot run a node at another precision")

    def cast(self, tensor: Any, dtype: str) -> Any:
        """`tensor` converted to `dtype` on the device (the tensor itself when it already has it)."""
        raise DriverError(f"driver {self.name} cannot convert a value to {dtype}")

    def to_host(self, tensor: Any) -> Any:
        """The elements of a device tensor as a CPU torch.Tensor (for comparing passes)."""
        raise DriverError(f"driver {self.name} cannot copy values to the host")

    def from_host(self, tensor: Any) -> Any:
        """A new device tensor holding the elements of a CPU torch.Tensor."""
        raise DriverError(f"driver {self.name} cannot copy values from the host")

    def nbytes(self, tensor: Any) -> int:
        return tensor.numel() * tensor.element_size()

    def storage_key(self, tensor: Any) -> int:
        """Identifies the allocation behind a tensor, so views share their base's cost."""
        return tensor.untyped_storage().data_ptr()

    def storage_nbytes(self, tensor: Any) -> int:
        return tensor.untyped_storage().nbytes()

    # -- drivers that place values by name (a chip with its own memory map) ---------------------------
    def locate_value(self, name: str, tensor: Any, unit: str | None = None) -> Location:
        """Where the Program value `name`, held by `tensor`, lives."""
        return self.locate(tensor, unit)

    def placement(self, name: str, tensor: Any) -> tuple[Location, ...]:
        """The value's shards: one Location per part a different unit stores (one on one device)."""
        return (self.locate_value(name, tensor),)

    def forget(self, nodes: list[int]) -> None:
        """The Timeline forgot these nodes' runs (an edit rewrites their future): drop what was kept of them."""

    # -- how long a node ran ---------------------------------------------------------------------------
    def mark(self) -> Any:
        """A point in the chip's time, taken before and after a node runs (`seconds_between`). The host's clock
        here; a chip that runs asynchronously marks its own queue, so the span is the node's, not its launch's."""
        return time.perf_counter()

    def seconds_between(self, start: Any, end: Any) -> float:
        """Seconds from mark `start` to mark `end` (waiting for `end` to be reached, on an asynchronous chip)."""
        return end - start

    # -- a GPU: checks read back in batches, a device-side checkpoint pool, the caching allocator -----
    def check(self, tensor: Any) -> Any:
        """Start the checks `inspect` makes of a write without waiting for them; `read_checks` collects them."""
        return self.inspect(tensor)

    def read_checks(self, checks: list[Any], tensors: list[Any]) -> ChecksReadback:
        """Send a batch of `check` results to the host (asynchronously where the chip can). `tensors` are the
        values written, for a check that needs a closer look (a NaN's finite-only stats)."""
        return ChecksReadback(list(checks))

    def checkpoint_pool(self, capacity: int) -> Any:
        """A preallocated pool of `capacity` bytes on the device that the ring copies retained versions into."""
        raise DriverError(f"driver {self.name} has no device-side checkpoint pool")

    def allocator_info(self, address: int) -> dict[str, Any]:
        """What the chip's allocator knows now of the memory at `address` (segment, block, stream, pool).
        Asked for on demand, never per write: it may cost a snapshot of the allocator."""
        return {}


def open_driver(spec: str, options: Mapping[str, Any] | None = None) -> Driver:
    """`auto`, `torch:cpu`, `torch:cuda`, `torch:cuda:N`, `sim`, `sim:<chip>`; a torch spec may end
    in a compute precision, `torch:cpu:float64`: every floating op then runs in it (the reference pass).
    `options` are the driver's own launch options (the sim chip's `seed`, `schedule`, `faults`)."""
    kind, _, rest = spec.partition(":")
    if kind == "sim":
        from hardware.drivers.sim import SimDriver

        return SimDriver.from_spec(spec, options)
    if options:
        raise DriverError(f"driver '{spec}' takes no options ({', '.join(sorted(options))}): they are the sim chip's")
    if spec == "auto" or kind == "torch":
        from hardware.drivers.torch import TorchDriver

        return TorchDriver.from_spec(spec)
    raise DriverError(f"unknown driver '{spec}': use auto, torch:cpu, torch:cuda, torch:cuda:N, sim or sim:<chip>")
