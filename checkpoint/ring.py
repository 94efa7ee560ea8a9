"""The checkpoint ring: retained value versions under a byte budget.

A functional graph's values are written once, so a checkpoint is a set of references to
the versions live at its tick, not a copy. The ring holds every version it can afford;
over budget it evicts the versions farthest from the current position that no kept
checkpoint pins, then thins checkpoints (dense near now, sparse far back, as rr does).
An evicted version is recomputed from its nearest retained ancestors when next needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from hardware.driver import CheckpointPool
from hardware.ticks import Tick


VersionKey = tuple[str, Tick]  # (value name, tick that wrote it; -1 for the initial state)
EVICTION_SLACK = 32  # an eviction pass frees this fraction of the budget beyond what is needed


@dataclass
class Checkpoint:
    tick: Tick
    pins: frozenset[VersionKey]
    tier: str = "host"
    thinned: bool = False  # no longer protects its pins: they spill down the tiers (or are recomputed)


@dataclass
class Ring:
    """Owns every retained tensor except the Program's own (inputs, parameters, initial buffers)."""

    budget: int  # bytes
    storage_of: Callable[[Any], tuple[Hashable, int]]  # tensor -> (allocation key, allocation bytes)
    tier: str = "host"
    spill: Callable[[VersionKey, Any], None] | None = None  # where evicted versions go (lower tiers)
    pool: CheckpointPool | None = None  # the driver's device-side pool: retained versions are copies in it
    free_storages: set[Hashable] = field(default_factory=set)  # allocations owned by the Program (cost nothing)
    # The retained tensors and each one's allocation (its bytes are in _sizes): two dict entries per version, no
    # object of its own (host time and the garbage collector's work, for each of a run's thousands of writes).
    _slots: dict[VersionKey, Any] = field(default_factory=dict)
    _storages: dict[VersionKey, Hashable] = field(default_factory=dict)
    _refs: dict[Hashable, int] = field(default_factory=dict)  # allocation -> retained versions using it
    _sizes: dict[Hashable, int] = field(default_factory=dict)
    checkpoints: dict[Tick, Checkpoint] = field(default_factory=dict)
    _victims: list[VersionKey] = field(default_factory=list)  # eviction candidates, nearest first (_victims_at)
    _victims_key: tuple | None = None  # the position and checkpoints they were sorted for
    _pinned: set[VersionKey] = field(default_factory=set)  # the pins then
    _fresh: list[VersionKey] = field(default_factory=list)  # versions retained since they were sorted
    used: int = 0
    peak: int = 0
    evictions: int = 0

    def get(self, key: VersionKey) -> Any | None:
        tensor = self._slots.get(key)
        if tensor is not None and self.pool is not None:
            self.pool.ready(tensor)
        return tensor

    def __contains__(self, key: VersionKey) -> bool:
        return key in self._slots

    def keys(self) -> list[VersionKey]:
        return list(self._slots)

    def cost(self, tensor: Any, place: tuple[Hashable, int] | None = None) -> int:
        """Bytes retaining `tensor` would add (0 for a view of something already retained); `place`: its
        `storage_of`, when the caller has it."""
        storage, nbytes = self.storage_of(tensor) if place is None else place
        if storage in self.free_storages or self._refs.get(storage):
            return 0
        return nbytes if self.pool is None else self.pool.cost(tensor)

    def put(self, key: VersionKey, tensor: Any, protect: Callable[[VersionKey], bool],
            distance: Callable[[VersionKey], tuple[int, int]], position: Tick,
            place: tuple[Hashable, int] | None = None) -> bool:
        """Retain `tensor` if room can be made; `protect` marks versions that must stay; `place`: its `storage_of`,
        when the caller has it.

        Returns False when even after eviction and thinning it does not fit: the caller then
        uses it without retaining it, and it will be recomputed when needed again."""
        if key in self._slots:
            return True
        storage, nbytes = place = self.storage_of(tensor) if place is None else place
        need = self.cost(tensor, place)
        if not self._room(need) and not self._make_room(need, protect, distance, position, key):
            return False
        if self.pool is not None and storage not in self.free_storages:
            tensor = self.pool.adopt(tensor)  # the Program's own memory is never copied
            storage, nbytes = self.pool.storage_of(tensor)
        self._slots[key] = tensor
        self._storages[key] = storage
        if self._victims_key is not None:
            self._fresh.append(key)
            if len(self._fresh) > len(self._slots):  # no eviction for long: sort everything when one comes
                self._victims_key, self._fresh = None, []
        if storage not in self.free_storages:
            if not self._refs.get(storage):
                self.used += nbytes
                self._sizes[storage] = nbytes
            self._refs[storage] = self._refs.get(storage, 0) + 1
        if self.used > self.peak:
            self.peak = self.used
        return True

    def drop(self, key: VersionKey) -> None:
        if self._slots.pop(key, None) is None:
            return
        storage = self._storages.pop(key)
        if storage in self.free_storages:
            return
        self._refs[storage] -= 1
        if self._refs[storage] == 0:
            del self._refs[storage]
            self.used -= self._sizes.pop(storage)
            if self.pool is not None:
                self.pool.release(storage)

    def clear(self) -> None:
        """Let go of every retained version and of the device pool (the session ended)."""
        for key in list(self._slots):
            self.drop(key)
        self.pool = None
        self._victims, self._victims_key, self._fresh = [], None, []

    def drop_after(self, tick: Tick) -> None:
        """Forget versions written at or after `tick` and the checkpoints past it."""
        for key in [k for k in self._slots if k[1] >= tick]:
            self.drop(key)
        for t in [t for t in self.checkpoints if t > tick]:
            del self.checkpoints[t]

    def pinned(self) -> set[VersionKey]:
        out: set[VersionKey] = set()
        for cp in self.checkpoints.values():
            if not cp.thinned:
                out |= cp.pins
        return out

    def _make_room(self, need: int, protect: Callable[[VersionKey], bool], distance: Callable[[VersionKey], tuple[int, int]],
                   position: Tick, incoming: VersionKey) -> bool:
        """Evict the versions farthest from `position` until `need` fits with some slack below the budget. The
        candidates are sorted once and kept while the position and the checkpoints stay as they were (a chain of
        recomputations at one position puts version after version): evicting one at a time, each after a scan of
        every retained version, is quadratic in a long run's thousands of small versions."""
        if need > self.budget:
            return False
        slack = self.budget // EVICTION_SLACK
        while not self._room(need):
            victims = self._victims_at(position, distance)
            skipped = False
            while victims and not (self._room(need) and self.used + need + slack <= self.budget):
                victim = victims.pop()
                if victim not in self._slots or protect(victim) or victim == incoming:
                    skipped |= victim in self._slots  # held by the step under way: a candidate again later
                    continue  # or gone since the candidates were sorted
                if self.spill is not None:
                    self.spill(victim, self._slots[victim])
                self.drop(victim)
                self.evictions += 1
            if self._room(need) or victims:
                continue
            if self._fresh or skipped:  # versions retained since the sort, or skipped now, may go before a thinning
                self._victims_key = None
                if self._victims_at(position, distance) and self._evictable(protect, incoming):
                    continue
            if not self._thin(position):
                return False
        return True

    def _evictable(self, protect: Callable[[VersionKey], bool], incoming: VersionKey) -> bool:
        """Does the freshly sorted candidate list hold a version that may go now?"""
        return any(k in self._slots and not protect(k) and k != incoming for k in self._victims)

    def _victims_at(self, position: Tick, distance: Callable[[VersionKey], tuple[int, int]]) -> list[VersionKey]:
        """The unpinned retained versions, nearest first (the farthest is popped first), for this position and
        these checkpoints: sorted again only when either changed; once all were taken, the versions retained since
        (a recomputation's, near the position) are sorted alone."""
        key = (position, frozenset((t, cp.thinned, id(cp.pins)) for t, cp in self.checkpoints.items()))
        if self._victims_key != key:
            self._pinned = self.pinned()
            self._victims = sorted((k for k in self._slots if k not in self._pinned), key=distance)
            self._victims_key, self._fresh = key, []
        elif not self._victims and self._fresh:
            self._victims = sorted((k for k in self._fresh if k in self._slots and k not in self._pinned), key=distance)
            self._fresh = []
        return self._victims

    def _room(self, need: int) -> bool:
        """Can `need` more bytes be retained (in one free range of the pool, when there is one)?"""
        return self.used + need <= self.budget and (self.pool is None or need == 0 or self.pool.fits(need))

    def _thin(self, position: Tick) -> bool:
        """Thin the checkpoint whose loss leaves the smallest gap relative to its distance from now: it
        stays listed, but its versions may now leave this tier."""
        ticks = sorted(t for t, cp in self.checkpoints.items() if not cp.thinned)
        if len(ticks) <= 1:
            return False
        best, best_score = None, None
        for i, t in enumerate(ticks):
            if t == 0:
                continue  # the initial state is free and always kept
            left = ticks[i - 1] if i > 0 else 0
            right = ticks[i + 1] if i + 1 < len(ticks) else position
            score = (right - left) / (abs(position - t) + 1)
            if best_score is None or score < best_score:
                best, best_score = t, score
        if best is None:
            return False
        self.checkpoints[best].thinned = True
        return True

    def checkpoint_bytes(self, cp: Checkpoint) -> int:
        seen: set = set()
        total = 0
        for key in cp.pins:
            storage = self._storages.get(key)
            if key in self._storages and storage not in self.free_storages and storage not in seen:
                seen.add(storage)
                total += self._sizes[storage]
        return total
