"""Where bytes physically live."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Location:
    """One contiguous extent of device memory holding (part of) a value."""

    chip: str  # "cpu", "cuda:0", "sim:default"
    unit: str  # the unit that owns or wrote it ("host", "stream 7", "core 12")
    space: str  # memory space: "host", "HBM", "DRAM", "SRAM"
    address: int  # device address of the first element
    nbytes: int  # extent from address to one past the last element
    dtype: str = ""
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # allocator segment/block, bank
    bank: int | None = None  # the memory bank of a banked on-chip memory
    elements: tuple[tuple[int, int], ...] = ()  # the value's elements held here: [start, stop) per dimension

    def contains(self, address: int) -> bool:
        return self.address <= address < self.address + self.nbytes

    def overlaps(self, address: int, nbytes: int) -> bool:
        return self.address < address + nbytes and address < self.address + self.nbytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"], d["strides"] = list(self.shape), list(self.strides)
        d["elements"] = [list(e) for e in self.elements]
        return d


@dataclass(frozen=True)
class Placement:
    """A value's Locations: one per shard (a single one on one device)."""

    value: str
    shards: tuple[Location, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "shards": [s.to_dict() for s in self.shards]}
