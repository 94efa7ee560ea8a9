"""The driver contract: the only code that touches a chip.

A new chip is one file or folder in drivers/ implementing `Driver`, plus a line in the registry
(hardware/drivers/__init__.py). The contract is about the size of tinygrad's Allocator + Program pair:
describe the chip, load a Program, run one step, report where its outputs live, check them on the
device, read/write bytes, and copy values (pre-images). That is all a chip must do.

What some chips can do besides is a capability: a small Protocol below that a driver implements or
not, found with `isinstance` (the instruction level is one too: hardware/instructions.py). Code that
uses a capability goes through the helper of the same concern here, which falls back to what a chip
without it means (the host's clock, a value located by its tensor, no allocator, no pool) or says in
words that the chip cannot do it.
"""

from __future__ import annotations

import math
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Mapping, Protocol, runtime_checkable

from hardware.errors import DriverError
from hardware.instructions import InstructionDriver
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


@dataclass(frozen=True, init=False)
class WriteStats:
    """What the device computed about one written value, without copying it off the device."""

    digest: int
    nan: int
    inf: int
    min: float
    max: float
    mean: float

    def __init__(self, digest: int, nan: int, inf: int, min: float, max: float, mean: float):
        # The fields set at once: a frozen dataclass's own __init__ sets them one by one through object.__setattr__,
        # a microsecond for each of a run's writes.
        self.__dict__.update(digest=digest, nan=nan, inf=inf, min=min, max=max, mean=mean)

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0

    @staticmethod
    def empty() -> "WriteStats":
        return _NO_STATS


_NO_STATS = WriteStats(0, 0, 0, math.nan, math.nan, math.nan)  # frozen: one for every write without stats


class ChecksReadback:
    """A batch of on-device checks on its way to the host (`BatchedChecks.read_checks`); this one has arrived."""

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
    on_report: Callable[[str], None] | None = None  # what the driver tells the user (the Session shows it)

    @abstractmethod
    def describe(self) -> Chip: ...

    @abstractmethod
    def load(self, program: Program) -> Mapping[str, Any]:
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

    @abstractmethod
    def storage(self, tensor: Any) -> tuple[Hashable, int]:
        """The allocation behind a tensor and its bytes: views share their base's, so they cost nothing more."""


# -- capabilities: what some chips do besides the contract ------------------------------------------------
@runtime_checkable
class HostValues(Protocol):
    """Values that cross to the host as CPU torch tensors, and convert between dtypes on the device: comparing
    a pass with a reference, a function patch, a patched branch's consumers."""

    def to_host(self, tensor: Any) -> Any:
        """The elements of a device tensor as a CPU torch.Tensor (for comparing passes)."""

    def from_host(self, tensor: Any) -> Any:
        """A new device tensor holding the elements of a CPU torch.Tensor."""

    def cast(self, tensor: Any, dtype: str) -> Any:
        """`tensor` converted to `dtype` on the device (the tensor itself when it already has it)."""


@runtime_checkable
class Precision(Protocol):
    """The reference pass and precision patches run nodes wider than the Program says."""

    def execute_at(self, node: Node, args: tuple, kwargs: dict, dtype: str) -> list[Any]:
        """Run one node with its floating-point arithmetic in `dtype`: floating inputs and dtype
        arguments are widened to it (casts to a lower precision become no-ops) and so are its outputs."""


@runtime_checkable
class PlacesValues(Protocol):
    """A chip with its own memory map places each Program value by name, perhaps in shards over its units."""

    def locate_value(self, name: str, tensor: Any, unit: str | None = None) -> Location:
        """Where the Program value `name`, held by `tensor`, lives."""

    def placement(self, name: str, tensor: Any) -> tuple[Location, ...]:
        """The value's shards: one Location per part a different unit stores."""


@runtime_checkable
class Extents(Protocol):
    """A chip that says cheaply where a tensor's bytes are, without a whole Location."""

    def extent(self, tensor: Any) -> tuple[str, int, int]:
        """(memory space, address, bytes) of a tensor: all the write log keeps of each write's Location."""


@runtime_checkable
class AllocatorInfo(Protocol):
    """A chip whose memory a caching allocator hands out (a GPU)."""

    def allocator_info(self, address: int) -> dict[str, Any]:
        """What the chip's allocator knows now of the memory at `address` (segment, block, stream, pool).
        Asked for on demand, never per write: it may cost a snapshot of the allocator."""


@runtime_checkable
class Timing(Protocol):
    """A chip that runs asynchronously marks its own queue, so a node's span is its run's, not its launch's."""

    def mark(self) -> Any:
        """A point in the chip's time, taken before and after a node runs."""

    def seconds_between(self, start: Any, end: Any) -> float:
        """Seconds from mark `start` to mark `end` (waiting for `end` to be reached)."""


@runtime_checkable
class BatchedChecks(Protocol):
    """Checks computed on the device as each value is written and read back in batches (a GPU: one host sync
    a batch, not one a write)."""

    check_batch: int  # writes whose checks a Timeline reads back together by default

    def check(self, tensor: Any) -> Any:
        """Start the checks `inspect` makes of a write without waiting for them; `read_checks` collects them."""

    def read_checks(self, checks: list[Any], tensors: list[Any]) -> ChecksReadback:
        """Send a batch of `check` results to the host (asynchronously where the chip can). `tensors` are the
        values written, for a check that needs a closer look (a NaN's finite-only stats)."""


class CheckpointPool(Protocol):
    """A preallocated range of device memory the ring copies retained versions into (hardware/drivers/torch/
    device_pool.py): retaining a value then keeps no allocator block of the run's, and checkpointing allocates
    nothing."""

    capacity: int  # bytes
    stream: Any  # the side stream the pool copies on, which a spill to the host orders itself after

    def holds(self, tensor: Any) -> bool:
        """Is `tensor` a view into the pool?"""

    def fits(self, nbytes: int) -> bool:
        """Is there one free range for `nbytes`?"""

    def cost(self, tensor: Any) -> int:
        """Bytes of pool that retaining `tensor` takes (0 for one the pool holds already)."""

    def adopt(self, tensor: Any) -> Any:
        """`tensor` as a view into the pool, copied into a new slot unless the pool has it already."""

    def storage_of(self, tensor: Any) -> tuple[Hashable, int]:
        """(allocation key, bytes) of a pool view's slot."""

    def ready(self, tensor: Any) -> None:
        """Make the chip's compute wait for the copy that filled `tensor`'s slot."""

    def release(self, key: Hashable) -> None:
        """Free a slot the ring no longer retains (keys that are not the pool's are ignored)."""


@runtime_checkable
class PoolsCheckpoints(Protocol):
    """A chip with a device-side checkpoint pool (a GPU: device-to-device copies on a side stream)."""

    pools_checkpoints: bool  # whether the ring copies retained versions into a pool by default

    def checkpoint_pool(self, capacity: int) -> CheckpointPool:
        """A preallocated pool of about `capacity` bytes on the device (less where the device has less free)."""


@runtime_checkable
class Forgets(Protocol):
    """A chip that keeps something of each node's run (its Schedule, its node-start state)."""

    def forget(self, nodes: list[int]) -> None:
        """The Timeline forgot these nodes' runs (an edit rewrites their future): drop what was kept of them."""


# -- using a capability, or what a chip without it means -----------------------------------------------
CAPABILITIES: tuple[type, ...] = (HostValues, Precision, PlacesValues, Extents, AllocatorInfo, Timing,
                                  BatchedChecks, PoolsCheckpoints, Forgets, InstructionDriver)
_found: "weakref.WeakKeyDictionary[Driver, frozenset[type]]" = weakref.WeakKeyDictionary()


def capabilities(driver: Driver) -> frozenset[type]:
    """The capabilities `driver` implements, found with `isinstance` once per driver (what a driver can do is
    what its class defines; asking a runtime Protocol costs microseconds, and the Timeline asks per write)."""
    try:
        found = _found.get(driver)
    except TypeError:  # a driver that cannot be a key (a dataclass's __eq__ without __hash__): asked each time
        return frozenset(c for c in CAPABILITIES if isinstance(driver, c))
    if found is None:
        found = _found[driver] = frozenset(c for c in CAPABILITIES if isinstance(driver, c))
    return found


def to_host(driver: Driver, tensor: Any) -> Any:
    if HostValues in capabilities(driver):
        return driver.to_host(tensor)
    raise DriverError(f"driver {driver.name} cannot copy values to the host")


def from_host(driver: Driver, tensor: Any) -> Any:
    if HostValues in capabilities(driver):
        return driver.from_host(tensor)
    raise DriverError(f"driver {driver.name} cannot copy values from the host")


def cast(driver: Driver, tensor: Any, dtype: str) -> Any:
    if HostValues in capabilities(driver):
        return driver.cast(tensor, dtype)
    raise DriverError(f"driver {driver.name} cannot convert a value to {dtype}")


def execute_at(driver: Driver, node: Node, args: tuple, kwargs: dict, dtype: str) -> list[Any]:
    if Precision in capabilities(driver):
        return driver.execute_at(node, args, kwargs, dtype)
    raise DriverError(f"driver {driver.name} cannot run a node at another precision")


def locate_value(driver: Driver, name: str, tensor: Any, unit: str | None = None) -> Location:
    """Where the Program value `name`, held by `tensor`, lives (where the tensor does, on most chips)."""
    if PlacesValues in capabilities(driver):
        return driver.locate_value(name, tensor, unit)
    return driver.locate(tensor, unit)


WriteExtent = Callable[[str, Any, str], tuple[str, int, int]]  # (value name, its tensor, unit) -> extent


def write_extent_of(driver: Driver) -> WriteExtent:
    """How to find (memory space, address, bytes) of the write of a value held by a tensor, what the write log
    keeps, on `driver`: its capabilities asked once, not for each of a run's writes."""
    found = capabilities(driver)
    if Extents in found and PlacesValues not in found:
        extent = driver.extent
        return lambda name, tensor, unit: extent(tensor)

    def located(name: str, tensor: Any, unit: str) -> tuple[str, int, int]:
        loc = locate_value(driver, name, tensor, unit)
        return loc.space, loc.address, loc.nbytes
    return located


def allocator_info(driver: Driver, address: int) -> dict[str, Any]:
    """What the chip's allocator knows now of `address`; {} on a chip without one."""
    return driver.allocator_info(address) if AllocatorInfo in capabilities(driver) else {}


def placement_of(driver: Driver, name: str, tensor: Any) -> tuple[Location, ...]:
    """The value's shards: on a chip that places values itself, its answer; else the one Location of its tensor,
    with what the allocator knows of its address (asked for on demand)."""
    if PlacesValues in capabilities(driver):
        return tuple(driver.placement(name, tensor))
    loc = driver.locate(tensor)
    return (replace(loc, extra={**loc.extra, **allocator_info(driver, loc.address)}),)


def clock(driver: Driver) -> Callable[[], Any]:
    """What takes a point in the chip's time, before and after a node runs: the host's clock on a chip without its
    own (found once per driver: a Timeline takes two marks a node)."""
    return driver.mark if Timing in capabilities(driver) else time.perf_counter


def mark(driver: Driver) -> Any:
    """A point in the chip's time, taken before and after a node runs: the host's clock on a chip without its own."""
    return clock(driver)()


def seconds_between(driver: Driver, start: Any, end: Any) -> float:
    """Seconds between two marks of `mark` (of `clock`)."""
    return driver.seconds_between(start, end) if Timing in capabilities(driver) else end - start


def check_batch(driver: Driver) -> int:
    """Writes whose checks the chip reads back together (1: each one as it is written)."""
    return driver.check_batch if BatchedChecks in capabilities(driver) else 1


def check(driver: Driver, tensor: Any) -> Any:
    """Start the checks of a write (`read_checks` collects them); on a chip without batches, made at once."""
    return driver.check(tensor) if BatchedChecks in capabilities(driver) else driver.inspect(tensor)


def read_checks(driver: Driver, checks: list[Any], tensors: list[Any]) -> ChecksReadback:
    if BatchedChecks in capabilities(driver):
        return driver.read_checks(checks, tensors)
    return ChecksReadback(list(checks))


def pools_checkpoints(driver: Driver) -> bool:
    """Whether the ring copies retained versions into a device-side pool by default."""
    return PoolsCheckpoints in capabilities(driver) and driver.pools_checkpoints


def checkpoint_pool(driver: Driver, capacity: int) -> CheckpointPool:
    if PoolsCheckpoints in capabilities(driver):
        return driver.checkpoint_pool(capacity)
    raise DriverError(f"driver {driver.name} has no device-side checkpoint pool")


def forget(driver: Driver, nodes: list[int]) -> None:
    """The Timeline forgot these nodes' runs: a chip that kept something of them drops it."""
    if Forgets in capabilities(driver):
        driver.forget(nodes)
