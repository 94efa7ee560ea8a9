"""The Timeline: position, Schedule, write log and checkpoint ring. The only thing that seeks.

State at tick t is a pure function of (Program, inputs, Schedule[0:t]). Steps before the
frontier have been executed and recorded; moving among them is moving a cursor. A value
needed at a position is taken from the ring, or recomputed from its nearest retained
ancestors and checked against the digest the write log recorded (a mismatch is
non-determinism, reported, never silently accepted). Mutated buffers live in fixed
device memory: crossing their write tick backwards restores the pre-image.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, NewType

from checkpoint.branch import ArchiveBefore, Branch, Patch
from checkpoint.codec import dtype_of
from checkpoint.ring import Checkpoint, Ring, VersionKey
from checkpoint.spill import PinnedSpill
from hardware.driver import Driver, WriteStats
from hardware.errors import RewindError
from hardware.program import Node, Program
from hardware.stats_batch import WriteChecks
from provenance.writelog import KIND_BUFFER, KIND_EDIT, KIND_NODE, KIND_VIEW, WriteLog

Tick = NewType("Tick", int)
INITIAL = -1  # the version tick of inputs, parameters, constants and initial buffer contents
RECOMPUTE_OVERHEAD_S = 3e-4  # the host's side of running a node again: binding, its checks, the digest read back
FIRST_LOAD_RATE = 1 << 30  # bytes/s from a lower tier (lz4, a copy to the device) until a load was timed


def _edit_dict(edit: "Edit | None") -> dict | None:
    if edit is None:
        return None
    return {"value": edit.value, "offset": edit.offset, "data": edit.data, "description": edit.description}


def _keep(into: list, item: Any) -> Any:
    into.append(item)
    return item


@dataclass(frozen=True)
class Edit:
    """A user's write of bytes into a value (setVariable, writeMemory): a step of its own."""

    value: str
    offset: int
    data: bytes
    description: str = ""


@dataclass(frozen=True)
class Step:
    unit: int
    node: int | None  # node index, None for an edit
    edit: Edit | None = None


@dataclass(frozen=True)
class Nondeterminism:
    tick: int
    node: str
    value: str
    expected: int
    got: int

    def __str__(self) -> str:
        return (f"non-determinism at tick {self.tick}: node '{self.node}' rewrote '{self.value}' with digest "
                f"{self.got & 0xFFFFFFFFFFFFFFFF:016x}, recorded {self.expected & 0xFFFFFFFFFFFFFFFF:016x}")


@dataclass
class CheckpointInfo:
    tick: int
    bytes: int
    tier: str
    values: int


@dataclass
class Timeline:
    program: Program
    driver: Driver
    budget: int
    every: int | None = None  # checkpoint period in ticks; None: automatic
    on_nondeterminism: Callable[[Nondeterminism], None] | None = None
    tiers: Any = None  # checkpoint.tiers.HostTier: where the ring spills (host lz4, then disk)
    recorder: Any = None  # checkpoint.trace.TraceWriter: continuous recording to a trace file
    archive: Any = None  # a trace opened for reading: versions it holds are loaded, not recomputed
    check_batch: int | None = None  # writes whose on-device checks are read back together (None: the driver's)
    device_pool: bool | None = None  # retain copies in a preallocated device pool (None: as the driver prefers)
    schedule: list[Step] = field(init=False)
    position: int = field(init=False, default=0)
    frontier: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.chip = self.driver.describe()
        self.unit_names = [u.name for u in self.chip.units]
        self.initial: Mapping[str, Any] = self.driver.load(self.program)
        # Buffers the graph writes live in fixed device memory; their initial contents are kept as the pre-image.
        self.physical: dict[str, Any] = {}
        self.buffer_source: dict[str, str] = {}  # buffer value -> value whose tick writes it
        for src, buf in self.program.buffer_mutations.items():
            self.physical[buf] = self.initial[buf]
            self.initial[buf] = self.driver.clone(self.initial[buf])
            self.buffer_source[src] = buf
        self._physical_version = {b: INITIAL for b in self.physical}
        self.schedule = [Step(0, n.index) for n in self.program.nodes]
        self.node_tick = list(range(len(self.program.nodes)))
        self.versions: dict[str, list[int]] = {name: [INITIAL] for name in self.initial}
        self.log = WriteLog(self.program, self.chip.name)
        batch = self.driver.check_batch if self.check_batch is None else self.check_batch
        self.checks = WriteChecks(self.driver, self.log, batch) if batch != 1 else None  # 1: each at once
        pooled = self.driver.pools_checkpoints if self.device_pool is None else self.device_pool
        pool = self.driver.checkpoint_pool(self.budget) if pooled else None
        if pool is not None:
            self.budget = min(self.budget, pool.capacity)  # the driver may give less than asked (free memory)
        if self.tiers is not None and (pool is not None or self.driver.pools_checkpoints):
            self.tiers = PinnedSpill(self.tiers, self.driver.from_host, pool.stream if pool is not None else None)
        free = {self.driver.storage_key(t) for t in self.physical.values()}
        self.ring = Ring(self.budget, lambda t: (self.driver.storage_key(t), self.driver.storage_nbytes(t)),
                         tier="device" if "cuda" in self.chip.name else "host", free_storages=free,
                         spill=self.tiers.put if self.tiers is not None else None, pool=pool)
        self.ring.checkpoints[0] = Checkpoint(0, frozenset(), self.ring.tier)
        if self.every is None:
            self.every = max(1, round(math.sqrt(len(self.program.nodes))))
        self.nondeterminism: list[Nondeterminism] = []
        self._scratch: dict[VersionKey, Any] = {}
        # The values written at the frontier, as the driver returned them, until their last reader ran: the next
        # nodes read these rather than their retained copies, so computing never waits for a checkpoint copy.
        self._frontier_values: dict[VersionKey, Any] = {}
        self.patches: dict[int, Patch] = {}  # node index -> how this branch runs it instead
        self._seconds: dict[int, float] = {}
        self._load_rate = float(FIRST_LOAD_RATE)  # bytes/s the lower tiers loaded at, lately
        self.loaded = 0  # versions brought back from the lower tiers
        self.recomputed = 0  # versions computed again by running their node
        self._marks: dict[int, tuple[Any, Any]] = {}  # tick -> the driver's marks around its node, not yet read
        self._branches: list[Branch] = []

    # -- time --------------------------------------------------------------------------
    @property
    def seconds(self) -> dict[int, float]:
        """tick -> how long its node ran on the chip when it was executed (the marks are read when asked)."""
        for tick in list(self._marks):
            self._node_seconds(tick)
        return self._seconds

    @seconds.setter
    def seconds(self, seconds: dict[int, float]) -> None:
        self._marks.clear()
        self._seconds = seconds

    def _node_seconds(self, tick: int) -> float | None:
        marks = self._marks.pop(tick, None)
        if marks is not None:
            self._seconds[tick] = self.driver.seconds_between(*marks)
        return self._seconds.get(tick)

    @property
    def end(self) -> int:
        return len(self.schedule)

    def step_at(self, tick: int) -> Step | None:
        return self.schedule[tick] if 0 <= tick < len(self.schedule) else None

    def node_at(self, tick: int) -> Node | None:
        step = self.step_at(tick)
        return self.program.nodes[step.node] if step and step.node is not None else None

    def unit_name(self, unit: int) -> str:
        return self.unit_names[unit]

    def last_use_tick(self, name: str) -> int:
        last = self.program.values[name].last_use
        return self.end if last >= len(self.program.nodes) else self.node_tick[last]

    def version_at(self, name: str, position: int) -> int | None:
        """Tick of the version of `name` that exists when `position` steps have run."""
        ticks = self.versions.get(name)
        if not ticks:
            return None
        i = bisect.bisect_left(ticks, position)
        return ticks[i - 1] if i else None

    def defined(self, position: int | None = None) -> list[str]:
        pos = self.position if position is None else position
        return [name for name in self.versions if self.version_at(name, pos) is not None]

    def live(self, position: int | None = None) -> list[str]:
        pos = self.position if position is None else position
        return [n for n in self.defined(pos) if pos <= self.last_use_tick(n)]

    # -- moving --------------------------------------------------------------------------
    def forward(self) -> int:
        """Move one step forward, executing it if it was never run. Returns the step's tick."""
        if self.position >= self.end:
            raise RewindError("already at the end of the program")
        tick = self.position
        if tick == self.frontier:
            self._execute(tick)
            self.frontier += 1
        self.position = tick + 1
        self._sync_buffers()
        return tick

    def seek(self, tick: int) -> None:
        """Go to `tick` (0 .. end); executes the steps between the frontier and it if needed."""
        if not 0 <= tick <= self.end:
            raise RewindError(f"tick {tick} is outside the timeline (0..{self.end})")
        while self.frontier < tick:
            self.position = self.frontier
            self.forward()
        self.position = tick
        self._sync_buffers()

    def _sync_buffers(self) -> None:
        """Make each mutated buffer's physical memory hold its version at the position."""
        for buf, mem in self.physical.items():
            want = self.version_at(buf, self.position)
            if want != self._physical_version[buf]:
                self.driver.copy_into(mem, self.value_version(buf, want))
                self._physical_version[buf] = want

    # -- values ----------------------------------------------------------------------------
    def value(self, name: str, position: int | None = None) -> Any:
        """The tensor `name` holds when `position` steps have run (materialised if evicted). One that lives in the
        checkpoint pool comes back as a copy: the pool gives its slot to another version once the ring lets it
        go, which must not change a tensor the reader still holds."""
        tensor = self.resident(name, position)
        pool = self.ring.pool
        return self.driver.clone(tensor) if pool is not None and pool.holds(tensor) else tensor

    def resident(self, name: str, position: int | None = None) -> Any:
        """The tensor the engine holds for `name` at `position`, a pool slot included: for asking where it lives,
        not for keeping (`value` is for that)."""
        pos = self.position if position is None else position
        version = self.version_at(name, pos)
        if version is None:
            raise RewindError(f"'{name}' does not exist at tick {pos}")
        return self.value_version(name, version)

    def value_version(self, name: str, version: int) -> Any:
        key = (name, version)
        at_frontier = self._frontier_values.get(key)
        if at_frontier is not None:  # most reads while running: what the producer returned, still referenced
            return at_frontier
        stack = [key]
        try:
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
            return self._get(key)
        finally:
            self._scratch.clear()

    def _available(self, key: VersionKey) -> bool:
        if self._held(key):
            return True
        if key in self.ring:  # held in the scratch, so loading a sibling from a lower tier cannot evict it first
            self._scratch[key] = self.ring.get(key)
            return True
        if self.tiers is not None and self._recompute_rather_than_load(key):
            return False
        for source in (self.tiers, self.archive):
            started = time.perf_counter()
            tensor = source.load(key) if source is not None else None
            if tensor is not None:
                if source is self.tiers:
                    rate = self.driver.nbytes(tensor) / max(time.perf_counter() - started, 1e-9)
                    self._load_rate = 0.7 * self._load_rate + 0.3 * rate
                    self.loaded += 1
                self._store(key, tensor)
                return True
        return False

    def _held(self, key: VersionKey) -> bool:
        """Is the version at hand without the ring: the Program's, in the scratch, or a frontier value?"""
        return key[1] == INITIAL or key in self._scratch or key in self._frontier_values

    def _recompute_rather_than_load(self, key: VersionKey) -> bool:
        """Is running the version's node again, from inputs at hand, quicker than loading it from a lower tier?
        On a GPU a node takes microseconds where lz4 and a host-to-device copy of its output take milliseconds;
        a big matmul on a CPU can be the other way round. Both sides are measured: the node's time when it ran,
        the tiers' throughput when they last loaded."""
        name, tick = key
        step = self.schedule[tick]
        if step.node is None or name in self.physical or self.archive is not None:
            return False
        seconds = self._node_seconds(tick)
        node = self.program.nodes[step.node]
        inputs = [(i, self.version_at(i, tick)) for i in node.input_names()]
        if seconds is None or not all(self._held(k) or k in self.ring for k in inputs):
            return False
        info = self.program.values[name]
        return seconds + RECOMPUTE_OVERHEAD_S < info.numel * dtype_of(info.dtype).itemsize / self._load_rate

    def _get(self, key: VersionKey) -> Any:
        if key[1] == INITIAL:
            tensor = self.initial[key[0]]
            self.ring.free_storages.add(self.driver.storage_key(tensor))  # the Program owns it
            return tensor
        t = self._scratch.get(key)
        if t is None:
            t = self._frontier_values.get(key)
        return t if t is not None else self.ring.get(key)

    def _deps(self, key: VersionKey) -> list[VersionKey]:
        name, tick = key
        step = self.schedule[tick]
        if step.edit is not None:
            return [(name, self.version_at(name, tick))]
        node = self.program.nodes[step.node]
        if name in self.physical:  # a buffer version is the value its node wrote into it
            return [(self.program_source(name), tick)]
        deps = [(i, self.version_at(i, tick)) for i in node.input_names()]
        missing = [i for i, v in deps if v is None]
        if missing:
            raise RewindError(f"{node.describe()} needs {', '.join(missing)}, which no step before tick {tick} wrote")
        return deps

    def program_source(self, buffer: str) -> str:
        return next(src for src, buf in self.buffer_source.items() if buf == buffer)

    def _recompute(self, key: VersionKey) -> None:
        name, tick = key
        step = self.schedule[tick]
        if step.edit is not None:
            self._store(key, self._apply_edit(step.edit, tick))
            return
        if name in self.physical:
            self._scratch[key] = self._get((self.program_source(name), tick))
            return
        node = self.program.nodes[step.node]
        outputs = self._run_node(node, tick, self._get)
        self.recomputed += 1
        self._check_digests(node, tick, outputs)
        for out_name, tensor in zip(node.outputs, outputs):
            self._store((out_name, tick), tensor)

    def _check_digests(self, node: Node, tick: int, outputs: list[Any]) -> None:
        """A replayed step must write what the log recorded: a mismatch is non-determinism, reported."""
        recorded = self.log.digests_at(tick)
        for out_name, tensor in zip(node.outputs, outputs):
            expected = recorded.get(out_name)
            digest = self.driver.inspect(tensor).digest if expected is not None else None
            if expected is not None and expected != digest:
                finding = Nondeterminism(tick, node.name, out_name, expected, digest)
                self.nondeterminism.append(finding)
                if self.on_nondeterminism:
                    self.on_nondeterminism(finding)

    def replay_check(self, start: int = 0, stop: int | None = None) -> list[Nondeterminism]:
        """Re-run the executed node steps in [start, stop) from their recorded inputs, checking every
        write's digest. Returns the non-determinism found (each also reported as it is found)."""
        stop = self.frontier if stop is None else min(stop, self.frontier)
        found = len(self.nondeterminism)
        for tick in range(max(0, start), stop):
            node = self.node_at(tick)
            if node is None:
                continue
            try:
                self._check_digests(node, tick, self._run_node(node, tick, lambda k: self.value_version(*k)))
            finally:
                self._scratch.clear()
        return self.nondeterminism[found:]

    def _run_node(self, node: Node, tick: int, lookup: Callable[[VersionKey], Any]) -> list[Any]:
        return self.run_node(node, lambda n: lookup((n, self.version_at(n, tick))))

    def run_node(self, node: Node, value_of: Callable[[str], Any]) -> list[Any]:
        """Run one node on the driver with the inputs `value_of` gives, as this branch runs it."""
        patch = self.patches.get(node.index)
        if self.patches and patch is None:  # a patched producer may have written another dtype
            given = value_of
            value_of = lambda n: self.driver.cast(given(n), self.program.values[n].dtype)  # noqa: E731
        args, kwargs = node.bind(value_of)
        try:
            if patch is None:
                return self.driver.execute(node, args, kwargs)
            outputs = patch.run(self.driver, node, args, kwargs)
        except Exception as exc:
            raise RewindError(f"{node.describe()} failed on {self.driver.name}: {exc}") from exc
        return self._patched_outputs(node, patch, outputs)

    def _patched_outputs(self, node: Node, patch: Patch, outputs: list[Any]) -> list[Any]:
        """A patch changes how a node computes, never the shapes of what it writes."""
        for name, tensor in zip(node.outputs, outputs):
            want = self.program.values[name].shape
            if tuple(tensor.shape) != want:
                raise RewindError(f"{node.describe()} {patch.describe()} wrote '{name}' with shape "
                                  f"{list(tensor.shape)}; the program's is {list(want)}")
        return outputs

    def _apply_edit(self, edit: Edit, tick: int) -> Any:
        base = self._get((edit.value, self.version_at(edit.value, tick)))
        edited = self.driver.clone(base)
        self.driver.write(edited, edit.offset, edit.data)
        return edited

    def _store(self, key: VersionKey, tensor: Any) -> None:
        self._scratch[key] = tensor
        self.ring.put(key, tensor, protect=self._protected, distance=self._distance, position=self.position)

    def _protected(self, key: VersionKey) -> bool:
        return key in self._scratch

    def _distance(self, key: VersionKey) -> tuple[int, int]:
        """Eviction order: versions not live at the position first, then the farthest from it."""
        name, born = key
        pos = self.position
        last = self.last_use_tick(name)
        if born < pos <= last and self.version_at(name, pos) == born:
            return (0, max(pos - born, last - pos))
        return (1, born - pos if born >= pos else pos - last)

    # -- executing at the frontier -------------------------------------------------------------
    def _execute(self, tick: int) -> None:
        step = self.schedule[tick]
        unit = self.unit_name(step.unit)
        try:
            if self.recorder is not None:
                self.recorder.step(tick, step.unit, step.node, _edit_dict(step.edit))
            if step.edit is not None:
                edited = self._apply_edit(step.edit, tick)
                self._record(tick, None, step.edit.value, KIND_EDIT, edited, unit)
                return
            node = self.program.nodes[step.node]
            inputs: list[Any] = []
            started = self.driver.mark()
            outputs = self._run_node(node, tick, lambda k: _keep(inputs, self.value_version(*k)))
            self._marks[tick] = (started, self.driver.mark())
            input_storages = {self.driver.storage_key(t) for t in inputs if hasattr(t, "untyped_storage")}
            for name, tensor in zip(node.outputs, outputs):
                view = self.driver.storage_key(tensor) in input_storages
                self._record(tick, node.index, name, KIND_VIEW if view else KIND_NODE, tensor, unit)
                buf = self.buffer_source.get(name)
                if buf is not None:
                    self.driver.copy_into(self.physical[buf], tensor)
                    self._physical_version[buf] = tick
                    self.versions[buf].append(tick)
                    row = self._log_write(tick, unit, node.index, buf, KIND_BUFFER,
                                          self.driver.locate_value(buf, self.physical[buf], unit), tensor)
                    if self.recorder is not None:
                        self.recorder.write(self.log.row(row))
            self._forget_read(node, tick)
            if (tick + 1) % self.every == 0:
                self._checkpoint(tick + 1)
        finally:
            self._scratch.clear()

    def _record(self, tick: int, node: int | None, name: str, kind: int, tensor: Any, unit: str) -> None:
        row = self._log_write(tick, unit, node, name, kind, self.driver.locate_value(name, tensor, unit), tensor)
        self.versions.setdefault(name, []).append(tick)
        self._store((name, tick), tensor)
        if self.last_use_tick(name) > tick:
            self._frontier_values[(name, tick)] = tensor
        if self.recorder is not None:
            self.recorder.write(self.log.row(row))
            if kind != KIND_VIEW:  # a view is recomputed from what it views, without the device
                self.recorder.version(name, tick, tensor)

    def _log_write(self, tick: int, unit: str, node: int | None, name: str, kind: int, location: Any,
                   tensor: Any) -> int:
        """Log one write with its checks; batched, they run on the device and fill the row when their batch lands."""
        if kind == KIND_VIEW or self.checks is None:
            stats = WriteStats.empty() if kind == KIND_VIEW else self.driver.inspect(tensor)
            return self.log.append(tick, unit, node, name, kind, location, stats)
        row = self.log.append(tick, unit, node, name, kind, location, None)
        self.checks.add(row, tick, tensor)
        return row

    def _forget_read(self, node: Node, tick: int) -> None:
        """Let go of the frontier values `node` was the last to read (their retained copies stay in the ring)."""
        for name in node.input_names():
            if self.program.values[name].last_use == node.index:
                self._frontier_values.pop((name, self.version_at(name, tick)), None)

    def _checkpoint(self, tick: int) -> None:
        """Pin the retained versions live at `tick`, the frontier: the frontier values are the versions written and
        not yet read for the last time (an older version of an edited value is not live)."""
        ring, versions = self.ring, self.versions
        pins = frozenset(k for k in self._frontier_values if k in ring and versions[k[0]][-1] == k[1])
        self.ring.checkpoints[tick] = Checkpoint(tick, pins, self.ring.tier)
        if self.recorder is not None:
            self.recorder.checkpoint(tick, sorted(pins))

    # -- edits ---------------------------------------------------------------------------------
    def edit(self, value: str, offset: int, data: bytes, description: str = "") -> int:
        """Write bytes into `value` at the position: a new step that rewrites the future."""
        pos = self.position
        if self.version_at(value, pos) is None:
            raise RewindError(f"'{value}' does not exist at tick {pos}")
        self._truncate(pos)
        self.schedule.insert(pos, Step(0, None, Edit(value, offset, data, description)))
        self.node_tick = [t + 1 if t >= pos else t for t in self.node_tick]
        self.forward()
        return pos

    def reexecute_from(self, tick: int) -> None:
        """Forget the recorded future from `tick` and execute it again to the end (an experiment's replay)."""
        self.seek(tick)
        self._truncate(tick)
        self.seek(self.end)

    # -- branches ----------------------------------------------------------------------------------
    def branch(self, patches: Iterable[Patch]) -> Branch:
        """Set the recorded future aside from the first patched node's step and install `patches`:
        seeking forward from there executes the branch. `unbranch` brings the recorded future back."""
        patches = list(patches)
        if not patches:
            raise RewindError("a branch needs at least one patch")
        for patch in patches:
            if not 0 <= patch.node < len(self.program.nodes):
                raise RewindError(f"no node {patch.node} to patch (the program has {len(self.program.nodes)})")
        origin = self.position
        tick = min(self.node_tick[p.node] for p in patches)
        self.seek(tick)
        saved = Branch(tick, origin, self.frontier, dict(self.patches), self.log.tail(tick),
                       {n: ticks[bisect.bisect_left(ticks, tick):] for n, ticks in self.versions.items()},
                       list(self.schedule), list(self.node_tick), self.recorder, self.archive,
                       {t: s for t, s in self.seconds.items() if t >= tick})
        self.recorder = None
        if self.archive is not None:
            self.archive = ArchiveBefore(self.archive, tick)
        self._truncate(tick)
        self.patches.update({p.node: p for p in patches})
        self._branches.append(saved)
        return saved

    def unbranch(self, branch: Branch) -> None:
        """Drop the branch's future and bring back the one it set aside; return to where it began."""
        if not self._branches or self._branches[-1] is not branch:
            raise RewindError("branches are undone innermost first, and each once")
        self._branches.pop()
        self.position = min(self.position, branch.tick)
        self._truncate(branch.tick)
        self.patches, self.schedule, self.node_tick = branch.patches, branch.schedule, branch.node_tick
        self.log.extend(branch.log)
        for name, ticks in branch.versions.items():
            self.versions[name].extend(ticks)
        self.seconds.update(branch.seconds)
        self.frontier = branch.frontier
        self.recorder, self.archive = branch.recorder, branch.archive
        self.seek(branch.position)

    def _truncate(self, tick: int) -> None:
        """Forget everything recorded at or after `tick`: the future is about to change."""
        if self.frontier <= tick:
            return
        self.log.truncate(tick)
        self.ring.drop_after(tick)
        self._frontier_values = {k: v for k, v in self._frontier_values.items() if k[1] < tick}
        if self.tiers is not None:
            self.tiers.drop_after(tick)
        if self.recorder is not None:
            self.recorder.truncate(tick)
        for name, ticks in self.versions.items():
            del ticks[bisect.bisect_left(ticks, tick):]
        self.seconds = {t: s for t, s in self.seconds.items() if t < tick}
        for buf in self.physical:
            if self._physical_version[buf] >= tick:
                self._physical_version[buf] = None  # force a rewrite at the next sync
        self.driver.forget([s.node for s in self.schedule[tick:self.frontier] if s.node is not None])
        self.frontier = tick
        self._sync_buffers()

    def forget_from(self, tick: int) -> None:
        """Forget the recorded run from `tick` on (a driver's node will run differently): its steps
        execute again when next reached."""
        self.seek(min(tick, self.frontier))
        self._truncate(tick)

    # -- checkpoints ----------------------------------------------------------------------------
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
