"""The device tier's storage: one preallocated buffer that the ring copies retained versions into.

Retaining a value by reference keeps its allocator block, so a long run makes the caching
allocator grow segment after segment; copying it into a pool allocated once lets the output's
block go back to the allocator, as in an eager run, and checkpointing never allocates. Slots are
carved first-fit and a freed slot coalesces with its free neighbours. On a CUDA device the copies
go device to device on a side stream, ordered by events, so they overlap the compute stream; a
consumer waits for a slot's copy on the device, never on the host. On the CPU the same lines run
with torch.cpu's stream and event stand-ins, which order nothing: the CPU copies in program order.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Hashable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from hardware.errors import RewindError

ALIGN = 512  # bytes: every slot starts aligned for any dtype and for coalesced device access


def aligned(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


@dataclass
class _Slot:
    size: int
    source: StorageWeakRef  # the storage it is a copy of: while that lives, views of it share this slot
    source_ptr: int
    source_device: torch.device
    event: Any  # recorded on the side stream after the copy; None once the compute stream has waited for it


def side_stream(device: torch.device) -> Any:
    """A stream of its own on `device` (the CPU's stand-in: torch.cpu has one stream and runs it in order)."""
    return torch.cuda.Stream(device) if device.type == "cuda" else torch.cpu.Stream()


class DevicePool:
    def __init__(self, capacity: int, device: str | torch.device):
        if capacity <= 0:
            raise RewindError(f"a checkpoint pool needs a positive capacity, not {capacity} bytes")
        self.capacity = capacity
        self.buffer = torch.empty(capacity, dtype=torch.uint8, device=torch.device(device))
        self.device = self.buffer.device  # `cuda` made `cuda:0`: tensors report their device with its index
        self._storage = self.buffer.untyped_storage()
        self.base = self._storage.data_ptr()
        self._streams = torch.get_device_module(self.device)
        self.stream = side_stream(self.device)
        if self.buffer.is_cuda:  # freed with copies still queued on the side stream, it must not be reused before them
            self.buffer.record_stream(self.stream)
        self._free: list[list[int]] = [[0, capacity]]  # [offset, size], sorted by offset, never adjacent
        self._slots: dict[int, _Slot] = {}
        self._offsets: list[int] = []  # sorted offsets of the slots in use
        self._by_source: dict[int, int] = {}  # source storage address -> slot offset
        self.copies = 0
        self.bytes_copied = 0
        self.waits = 0  # copies the compute stream was made to wait for (each at most once)

    # -- what the pool holds ----------------------------------------------------------------------
    def holds(self, tensor: torch.Tensor) -> bool:
        """Is `tensor` a view into the pool?"""
        return tensor.untyped_storage().data_ptr() == self.base and tensor.device == self.device

    def slot_of(self, tensor: torch.Tensor) -> int | None:
        """The offset of the slot a pool view lies in."""
        if not self.holds(tensor):
            return None
        i = bisect.bisect_right(self._offsets, tensor.data_ptr() - self.base) - 1
        return self._offsets[i] if i >= 0 else None

    def slot_at(self, address: int) -> int | None:
        """The offset of the slot in use that holds device address `address`."""
        i = bisect.bisect_right(self._offsets, address - self.base) - 1
        if i < 0:
            return None
        offset = self._offsets[i]
        return offset if address < self.base + offset + self._slots[offset].size else None

    def _copy_of(self, tensor: torch.Tensor) -> int | None:
        storage = tensor.untyped_storage()
        offset = self._by_source.get(storage.data_ptr())
        if offset is None:
            return None
        slot = self._slots[offset]
        return None if slot.source.expired() or slot.source_device != storage.device else offset

    def storage_of(self, tensor: torch.Tensor) -> tuple[Hashable, int]:
        """(allocation key, bytes) of a pool view's slot, for the ring's accounting."""
        offset = self.slot_of(tensor)
        if offset is None:
            raise RewindError("the tensor is not in the checkpoint pool")
        return ("pool", offset), self._slots[offset].size

    def cost(self, tensor: torch.Tensor) -> int:
        """Bytes of pool that retaining `tensor` takes: 0 for a pool view or a view of a storage already copied."""
        if self.holds(tensor) or self._copy_of(tensor) is not None:
            return 0
        return aligned(tensor.untyped_storage().nbytes())

    def fits(self, nbytes: int) -> bool:
        size = aligned(nbytes)
        return any(free >= size for _, free in self._free)

    @property
    def used(self) -> int:
        return sum(s.size for s in self._slots.values())

    # -- copying in and out ---------------------------------------------------------------------
    def adopt(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as a view into the pool, its storage copied into a new slot unless the pool has it already.
        The ring checks `fits` first; adopting without room is an error."""
        if self.holds(tensor):
            return tensor
        offset = self._copy_of(tensor)
        if offset is None:
            offset = self._copy_in(tensor.untyped_storage())
        view = torch.empty(0, dtype=tensor.dtype, device=self.device)
        return view.set_(self._storage, offset // tensor.element_size() + tensor.storage_offset(),
                         tensor.shape, tensor.stride())

    def _copy_in(self, source: torch.UntypedStorage) -> int:
        nbytes = source.nbytes()
        offset = self._allocate(nbytes)
        src = torch.empty(0, dtype=torch.uint8, device=source.device).set_(source)
        dst = self.buffer[offset: offset + nbytes]
        # on the side stream after the write it copies and after every read of the slot's last tenant
        self.stream.wait_stream(self._streams.current_stream(self.device))
        with self._streams.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        if src.is_cuda:
            src.record_stream(self.stream)  # the allocator must not hand the output's block out before the copy ran
        event = self._streams.Event()
        event.record(self.stream)
        self._slots[offset] = _Slot(aligned(nbytes), StorageWeakRef(source), source.data_ptr(), source.device, event)
        bisect.insort(self._offsets, offset)
        self._by_source[source.data_ptr()] = offset
        self.copies += 1
        self.bytes_copied += nbytes
        return offset

    def ready(self, tensor: torch.Tensor) -> None:
        """Make the compute stream wait, on the device, for the copy that filled `tensor`'s slot."""
        offset = self.slot_of(tensor)
        slot = self._slots.get(offset) if offset is not None else None
        if slot is not None and slot.event is not None:
            self._streams.current_stream(self.device).wait_event(slot.event)
            slot.event = None  # later work on the compute stream is ordered after this wait
            self.waits += 1

    def release(self, key: Hashable) -> None:
        """Free a slot the ring no longer retains (ignores keys that are not the pool's)."""
        if not (isinstance(key, tuple) and key[0] == "pool"):
            return
        offset = key[1]
        slot = self._slots.pop(offset)
        self._offsets.remove(offset)
        if self._by_source.get(slot.source_ptr) == offset:
            del self._by_source[slot.source_ptr]
        self._give_back(offset, slot.size)

    # -- first-fit allocation over the buffer --------------------------------------------------------
    def _allocate(self, nbytes: int) -> int:
        size = aligned(nbytes)
        for i, (offset, free) in enumerate(self._free):
            if free >= size:
                if free == size:
                    del self._free[i]
                else:
                    self._free[i] = [offset + size, free - size]
                return offset
        raise RewindError(f"the checkpoint pool has no free range of {size} bytes "
                          f"({self.capacity - self.used} of {self.capacity} free, fragmented)")

    def _give_back(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self._free, [offset, 0])
        self._free.insert(i, [offset, size])
        if i + 1 < len(self._free) and offset + size == self._free[i + 1][0]:  # merge the next free range
            self._free[i][1] += self._free.pop(i + 1)[1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:  # merge into the previous one
            self._free[i - 1][1] += self._free.pop(i)[1]

    def free_ranges(self) -> list[tuple[int, int]]:
        return [(o, s) for o, s in self._free]
