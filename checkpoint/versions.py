"""The versions of a Timeline's values, and where each one is kept.

Each value has versions, one per tick that wrote it (INITIAL for the Program's own: inputs, parameters,
constants, initial buffer contents). A version needed at a position is taken from the ring, from the
lower tiers (host lz4, disk) or a trace's archive, or recomputed from its nearest retained ancestors by
running its node again; the Timeline that owns the store checks what a recomputation wrote against the
write log's digests. Buffers the graph mutates live in fixed device memory (`physical`), which is made to
hold the version of the position; their initial contents are kept as the pre-image.
"""

from __future__ import annotations

import bisect
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Protocol

from checkpoint.codec import dtype_of
from checkpoint.ring import Checkpoint, Ring, VersionKey
from checkpoint.spill import PinnedSpill
from checkpoint.steps import Edit, Step
from checkpoint.tiers import HostTier
from hardware.driver import Chip, Driver, checkpoint_pool, from_host, pools_checkpoints
from hardware.errors import RewindError
from hardware.program import Node, Program
from hardware.ticks import Tick

INITIAL = Tick(-1)  # the version tick of inputs, parameters, constants and initial buffer contents
RECOMPUTE_OVERHEAD_S = 3e-4  # the host's side of running a node again: binding, its checks, the digest read back
FIRST_LOAD_RATE = 1 << 30  # bytes/s from a lower tier (lz4, a copy to the device) until a load was timed

Lookup = Callable[[VersionKey], Any]  # a version's tensor, by key


class Tier(Protocol):
    """A lower tier the ring spills into (checkpoint/tiers.py's HostTier, or the PinnedSpill stage above it)."""

    def put(self, key: VersionKey, tensor: Any) -> None: ...

    def load(self, key: VersionKey) -> Any | None: ...

    def drop_after(self, tick: Tick) -> None: ...

    def tier_of(self, key: VersionKey) -> str | None: ...

    def close(self) -> None: ...


class Archive(Protocol):
    """Versions a recording holds (a trace opened for reading: checkpoint/trace.py's TraceArchive)."""

    def has(self, key: VersionKey) -> bool: ...

    def load(self, key: VersionKey) -> Any | None: ...


class Owner(Protocol):
    """What the store asks of the Timeline that owns it: where it stands, what each tick did, when a value is
    read for the last time, how long a node ran, and running a node again (as its branch runs it)."""

    @property
    def position(self) -> Tick: ...

    @property
    def schedule(self) -> list[Step]: ...

    def last_use_tick(self, name: str) -> Tick: ...

    def node_seconds(self, tick: Tick) -> float | None: ...

    def run_node_at(self, node: Node, tick: Tick, lookup: Lookup) -> list[Any]: ...

    def check_digests(self, node: Node, tick: Tick, outputs: list[Any]) -> None: ...


def held_bytes(driver: Driver, tensors: Iterable[Any]) -> int:
    """Bytes the allocations of `tensors` take."""
    return sum(driver.storage(t)[1] for t in tensors)


@dataclass
class CheckpointInfo:
    tick: Tick
    bytes: int
    tier: str
    values: int


class VersionStore:
    def __init__(self, owner: Owner, program: Program, driver: Driver, chip: Chip, budget: int,
                 tiers: HostTier | None, archive: Archive | None, device_pool: bool | None):
        """`chip`: the driver's description; `device_pool`: retain copies in a preallocated device pool (None: as
        the driver prefers)."""
        # The owner holds the store: a weak reference back, so a Timeline let go of (a relaunch replaces it) is freed
        # at once with every tensor it loaded, not when the garbage collector next finds a cycle.
        self.owner, self.program, self.driver = weakref.proxy(owner), program, driver
        self.archive = archive
        self.initial: Mapping[str, Any] = driver.load(program)
        # Buffers the graph writes live in fixed device memory; their initial contents are kept as the pre-image.
        self.physical: dict[str, Any] = {}
        self.buffer_source: dict[str, str] = {}  # value whose tick writes a buffer -> the buffer
        for src, buf in program.buffer_mutations.items():
            self.physical[buf] = self.initial[buf]
            self.initial[buf] = driver.clone(self.initial[buf])  # the driver's mapping takes the pre-image
            self.buffer_source[src] = buf
        self._physical_version: dict[str, Tick | None] = {b: INITIAL for b in self.physical}
        # Which buffers each node writes, and the position the buffers were last made to hold (None: unknown, so
        # the next sync checks every buffer): moving between two positions only the buffers written between them
        # can change, so a step forward checks its own writes, not every parameter and optimizer state.
        self._node_buffers = {n.index: [self.buffer_source[o] for o in n.outputs if o in self.buffer_source]
                              for n in program.nodes}
        self._synced: Tick | None = None
        self.versions: dict[str, list[Tick]] = {name: [INITIAL] for name in self.initial}
        pooled = pools_checkpoints(driver) if device_pool is None else device_pool
        pool = checkpoint_pool(driver, budget) if pooled else None
        if pool is not None:
            budget = min(budget, pool.capacity)  # the driver may give less than asked (free memory)
        self.budget = budget
        self.tiers: Tier | None = tiers
        if tiers is not None and (pool is not None or pools_checkpoints(driver)):
            self.tiers = PinnedSpill(tiers, lambda t: from_host(driver, t), pool.stream if pool is not None else None)
        free: set[Hashable] = {driver.storage(t)[0] for t in self.physical.values()}
        self.ring = Ring(budget, driver.storage, tier="device" if "cuda" in chip.name else "host",
                         free_storages=free, spill=self.tiers.put if self.tiers is not None else None, pool=pool)
        self.ring.checkpoints[0] = Checkpoint(Tick(0), frozenset(), self.ring.tier)
        self._scratch: dict[VersionKey, Any] = {}
        # The values written at the frontier, as the driver returned them, until their last reader ran: the next
        # nodes read these rather than their retained copies, so computing never waits for a checkpoint copy.
        self.frontier_values: dict[VersionKey, Any] = {}
        self.load_rate = float(FIRST_LOAD_RATE)  # bytes/s the lower tiers loaded at, lately
        self.loaded = 0  # versions brought back from the lower tiers
        self.recomputed = 0  # versions computed again by running their node

    # -- which versions exist ----------------------------------------------------------------------
    def version_at(self, name: str, position: Tick) -> Tick | None:
        """Tick of the version of `name` that exists when `position` steps have run."""
        ticks = self.versions.get(name)
        if not ticks:
            return None
        if ticks[-1] < position:  # the frontier's reads, most asks: its last version, without a search
            return ticks[-1]
        i = bisect.bisect_left(ticks, position)
        return ticks[i - 1] if i else None

    def program_source(self, buffer: str, tick: Tick) -> str:
        """The value whose write at `tick` wrote `buffer` (a training Program updates a parameter once per step,
        each step from a value of its own)."""
        node = self.program.nodes[self.owner.schedule[tick].node]
        return next(o for o in node.outputs if self.buffer_source.get(o) == buffer)

    # -- a version's tensor ------------------------------------------------------------------------
    def value(self, name: str, position: Tick) -> Any:
        """The tensor `name` holds when `position` steps have run (materialised if evicted). One that lives in the
        checkpoint pool comes back as a copy: the pool gives its slot to another version once the ring lets it
        go, which must not change a tensor the reader still holds."""
        tensor = self.resident(name, position)
        pool = self.ring.pool
        return self.driver.clone(tensor) if pool is not None and pool.holds(tensor) else tensor

    def resident(self, name: str, position: Tick) -> Any:
        """The tensor the engine holds for `name` at `position`, a pool slot included: for asking where it lives,
        not for keeping (`value` is for that)."""
        version = self.version_at(name, position)
        if version is None:
            raise RewindError(f"'{name}' does not exist at tick {position}")
        return self.value_version(name, version)

    def value_version(self, name: str, version: Tick) -> Any:
        key = (name, version)
        at_frontier = self.frontier_values.get(key)
        if at_frontier is not None:  # most reads while running: what the producer returned, still referenced
            return at_frontier
        return self.value_versions([key])[0]

    def value_versions(self, keys: list[VersionKey]) -> list[Any]:
        """Several versions at once: what recomputing one needs is kept for the others until all are made (the
        parameters and optimizer state of a step, recomputed from one earlier checkpoint, share its whole chain)."""
        try:
            return [self._materialize(key) for key in keys]
        finally:
            self._scratch.clear()

    def _materialize(self, key: VersionKey) -> Any:
        stack = [key]
        while stack:
            k = stack[-1]
            if self._available(k):
                stack.pop()
                continue
            missing = [d for d in self._deps(k) if not self._available(d)]
            if missing:
                stack.extend(missing)
                continue
            self._recompute(k)
            stack.pop()
        return self.get(key)

    def _available(self, key: VersionKey) -> bool:
        if self._held(key):
            return True
        if key in self.ring:  # held in the scratch, so loading a sibling from a lower tier cannot evict it first
            self._scratch[key] = self.ring.get(key)
            return True
        if self.tiers is not None and self.recompute_rather_than_load(key):
            return False
        sources: tuple[Tier | Archive | None, ...] = (self.tiers, self.archive)
        for source in sources:
            started = time.perf_counter()
            tensor = source.load(key) if source is not None else None
            if tensor is not None:
                if source is self.tiers:
                    rate = self.driver.storage(tensor)[1] / max(time.perf_counter() - started, 1e-9)
                    self.load_rate = 0.7 * self.load_rate + 0.3 * rate
                    self.loaded += 1
                self.keep(key, tensor)
                return True
        return False

    def _held(self, key: VersionKey) -> bool:
        """Is the version at hand without the ring: the Program's, in the scratch, or a frontier value?"""
        return key[1] == INITIAL or key in self._scratch or key in self.frontier_values

    def recompute_rather_than_load(self, key: VersionKey) -> bool:
        """Is running the version's node again, from inputs at hand, quicker than loading it from a lower tier?
        On a GPU a node takes microseconds where lz4 and a host-to-device copy of its output take milliseconds;
        a big matmul on a CPU can be the other way round. Both sides are measured: the node's time when it ran,
        the tiers' throughput when they last loaded."""
        name, tick = key
        step = self.owner.schedule[tick]
        if step.node is None or name in self.physical or self.archive is not None:
            return False
        seconds = self.owner.node_seconds(tick)
        node = self.program.nodes[step.node]
        inputs = [(i, self.version_at(i, tick)) for i in node.input_names()]
        if seconds is None or not all(self._held(k) or k in self.ring for k in inputs):
            return False
        info = self.program.values[name]
        return seconds + RECOMPUTE_OVERHEAD_S < info.numel * dtype_of(info.dtype).itemsize / self.load_rate

    def get(self, key: VersionKey) -> Any:
        """A version at hand: the Program's, in the scratch, a frontier value or retained by the ring."""
        if key[1] == INITIAL:
            tensor = self.initial[key[0]]
            self.ring.free_storages.add(self.driver.storage(tensor)[0])  # the Program owns it
            return tensor
        t = self._scratch.get(key)
        if t is None:
            t = self.frontier_values.get(key)
        return t if t is not None else self.ring.get(key)

    def _deps(self, key: VersionKey) -> list[VersionKey]:
        name, tick = key
        step = self.owner.schedule[tick]
        if step.edit is not None:
            return [(name, self.version_at(name, tick))]
        node = self.program.nodes[step.node]
        if name in self.physical:  # a buffer version is the value its node wrote into it
            return [(self.program_source(name, tick), tick)]
        deps = [(i, self.version_at(i, tick)) for i in node.input_names()]
        missing = [i for i, v in deps if v is None]
        if missing:
            raise RewindError(f"{node.describe()} needs {', '.join(missing)}, which no step before tick {tick} wrote")
        return deps

    def _recompute(self, key: VersionKey) -> None:
        name, tick = key
        step = self.owner.schedule[tick]
        if step.edit is not None:
            self.keep(key, self.apply_edit(step.edit, tick))
            return
        if name in self.physical:
            self._scratch[key] = self.get((self.program_source(name, tick), tick))
            return
        node = self.program.nodes[step.node]
        outputs = self.owner.run_node_at(node, tick, self.get)
        self.recomputed += 1
        self.owner.check_digests(node, tick, outputs)
        for out_name, tensor in zip(node.outputs, outputs):
            self.keep((out_name, tick), tensor)

    def apply_edit(self, edit: Edit, tick: Tick) -> Any:
        """The edited value: a copy of the version the edit writes into, with its bytes written."""
        key = (edit.value, self.version_at(edit.value, tick))
        base = self.get(key)
        if base is None:  # evicted before the edit ran (a small ring, an edit in the past): made again
            base = self.value_version(*key)
        edited = self.driver.clone(base)
        self.driver.write(edited, edit.offset, edit.data)
        return edited

    def keep(self, key: VersionKey, tensor: Any, place: tuple[Hashable, int] | None = None,
             position: Tick | None = None) -> None:
        """Hold `tensor` for the step under way, and retain it if the ring can make room (`place`: its allocation and
        bytes, `position`: the owner's, when the caller has them)."""
        self._scratch[key] = tensor
        position = self.owner.position if position is None else position
        self.ring.put(key, tensor, self._protected, self._distance, position, place)

    def release(self) -> None:
        """The step under way is done: what it held may be evicted."""
        self._scratch.clear()

    def _protected(self, key: VersionKey) -> bool:
        return key in self._scratch

    def _distance(self, key: VersionKey) -> tuple[int, int]:
        """Eviction order: versions not live at the position first, then the farthest from it."""
        name, born = key
        pos = self.owner.position
        last = self.owner.last_use_tick(name)
        if born < pos <= last and self.version_at(name, pos) == born:
            return (0, max(pos - born, last - pos))
        return (1, born - pos if born >= pos else pos - last)

    # -- versions written at the frontier ----------------------------------------------------------
    def written(self, name: str, tick: Tick, tensor: Any, read_later: bool | None = None,
                place: tuple[Hashable, int] | None = None, retain: bool = True) -> None:
        """`tick` wrote `tensor` as a new version of `name`: retained (unless not `retain`: a checkpoint may retain it
        while it is held), and held until its last reader ran (`read_later`: whether a later step reads it, when the
        caller knows; `place`: the tensor's allocation and bytes)."""
        self.versions.setdefault(name, []).append(tick)
        key = (name, tick)
        if retain:
            self.keep(key, tensor, place, tick)  # the owner stands at the tick it executes
        if self.owner.last_use_tick(name) > tick if read_later is None else read_later:
            self.frontier_values[key] = tensor

    def write_buffer(self, buffer: str, tick: Tick, tensor: Any) -> Any:
        """`tick` wrote `tensor` into a mutated buffer's fixed memory; returns that memory."""
        memory = self.physical[buffer]
        self.driver.copy_into(memory, tensor)
        self._physical_version[buffer] = tick
        self.versions[buffer].append(tick)
        return memory

    def reader(self, tick: Tick, read: list) -> Callable[[str], Any]:
        """What running the node of `tick` at the frontier reads: each input's version then, appended to `read`. The
        versions written so far are all before `tick`, so each one's is its last; most are frontier values, the others
        the Program's own (at hand) or taken from the store."""
        frontier, version_at = self.frontier_values, self.version_at

        def value_of(name: str) -> Any:
            version = version_at(name, tick)
            key = (name, version)
            tensor = frontier.get(key)
            if tensor is None:
                tensor = self.get(key) if version == INITIAL else self.value_version(name, version)
            read.append(tensor)
            return tensor
        return value_of

    def read_last(self, names: Iterable[str], tick: Tick) -> None:
        """Let go of the frontier values of `names`, the inputs the node of `tick` was the last to read (their
        retained copies stay in the ring)."""
        frontier, version_at = self.frontier_values, self.version_at
        for name in names:
            frontier.pop((name, version_at(name, tick)), None)

    def checkpoint(self, tick: Tick, retained: bool = True) -> frozenset[VersionKey]:
        """Pin the retained versions live at `tick`, the frontier: the frontier values are the versions written and
        not yet read for the last time (an older version of an edited value is not live). Not `retained`: the steps
        before kept none of theirs, so the live ones are retained now (as the budget allows). Returns the pins."""
        ring, versions = self.ring, self.versions
        if not retained:
            for key, tensor in list(self.frontier_values.items()):
                if key not in ring and versions[key[0]][-1] == key[1]:
                    self.keep(key, tensor, position=tick)
        pins = frozenset(k for k in self.frontier_values if k in ring and versions[k[0]][-1] == k[1])
        ring.checkpoints[tick] = Checkpoint(tick, pins, ring.tier)
        return pins

    def sync_buffers(self, position: Tick) -> None:
        """Make each mutated buffer's physical memory hold its version at `position`."""
        if not self.physical or position == self._synced:
            return
        stale = [(buf, want) for buf in self._buffers_to_sync(position)
                 if (want := self.version_at(buf, position)) != self._physical_version[buf]]
        for (buf, want), tensor in zip(stale, self.value_versions(stale)):
            self.driver.copy_into(self.physical[buf], tensor)
            self._physical_version[buf] = want
        self._synced = position

    def ran_ahead(self, start: Tick, stop: Tick) -> None:
        """The steps start..stop-1 ran at the frontier and wrote their buffers' memory, wherever the position was:
        what that memory holds now is the versions at `stop` if it held those at `start`, else a mix."""
        if self.physical:
            self._synced = stop if self._synced == start else None

    def _buffers_to_sync(self, position: Tick) -> Iterable[str]:
        """The buffers whose version may differ from what their memory holds: those written between the last
        synced position and `position` (every buffer when that is unknown or the move is long)."""
        last = self._synced
        if last is None or abs(position - last) > 4 * len(self.physical):
            return list(self.physical)
        lo, hi = (last, position) if last <= position else (position, last)
        if hi - lo == 1:  # a step forward or back: the buffers of its one step
            step = self.owner.schedule[lo]
            if step.node is not None:
                return self._node_buffers[step.node]
        touched: dict[str, None] = {}
        for step in self.owner.schedule[lo:hi]:
            if step.node is not None:
                touched.update(dict.fromkeys(self._node_buffers[step.node]))
            elif step.edit is not None and step.edit.value in self.physical:
                touched[step.edit.value] = None
        return touched

    def held_buffers(self, position: Tick, held_already: int = 0) -> dict[str, tuple[Tick | None, Any]]:
        """Copies of the mutated buffers as they are at `position`, when it is where they were last synced and they
        fit, with the `held_already` bytes other branches hold, in a quarter of the ring's budget (else {}: they
        will be recomputed when needed). Never in a device pool's memory: the pool was sized to what is free."""
        if self._synced != position or not self.physical or self.ring.pool is not None:
            return {}
        if held_already + held_bytes(self.driver, self.physical.values()) > self.budget // 4:
            return {}
        return {buf: (self._physical_version[buf], self.driver.clone(mem)) for buf, mem in self.physical.items()}

    def put_back_buffers(self, held: dict[str, tuple[Tick | None, Any]], position: Tick) -> None:
        """Make the buffers hold copies `held_buffers` took, where their versions at `position` are those."""
        for buf, (version, tensor) in held.items():
            if version is not None and self.version_at(buf, position) == version:
                self.driver.copy_into(self.physical[buf], tensor)
                self._physical_version[buf] = version

    def let_go(self) -> None:
        """Give back every version the store holds but the Program's own (the session ended): what is read afterwards
        is recomputed from those."""
        self.ring.clear()
        self.frontier_values.clear()
        self._scratch.clear()

    def resync(self) -> None:
        """The versions changed other than by running forward (a trace's rows loaded): check every buffer at the
        next sync."""
        self._synced = None

    def truncate(self, tick: Tick) -> None:
        """Forget every version written at or after `tick` (the buffers are rewritten at the next sync)."""
        self.ring.drop_after(tick)
        self.frontier_values = {k: v for k, v in self.frontier_values.items() if k[1] < tick}
        if self.tiers is not None:
            self.tiers.drop_after(tick)
        for ticks in self.versions.values():
            del ticks[bisect.bisect_left(ticks, tick):]
        for buf in self.physical:
            version = self._physical_version[buf]
            if version is None or version >= tick:
                self._physical_version[buf] = None  # force a rewrite at the next sync
        self._synced = None

    # -- checkpoints -------------------------------------------------------------------------------
    def checkpoints(self) -> list[CheckpointInfo]:
        return [CheckpointInfo(cp.tick, self.ring.checkpoint_bytes(cp), self._tier_of(cp), len(cp.pins))
                for _, cp in sorted(self.ring.checkpoints.items())]

    def _tier_of(self, cp: Checkpoint) -> str:
        """The slowest tier holding one of the checkpoint's versions."""
        order = [self.ring.tier, "host (lz4)", "disk", "trace", "recompute"]
        worst = 0
        for key in cp.pins:
            if key in self.ring:
                continue
            tier = self.tiers.tier_of(key) if self.tiers is not None else None
            if tier is None:
                tier = "trace" if self.archive is not None and self.archive.has(key) else "recompute"
            worst = max(worst, order.index(tier))
        return order[worst]
