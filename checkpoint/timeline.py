"""The Timeline: position, Schedule, write log and the store of versions. The only thing that seeks.

State at tick t is a pure function of (Program, inputs, Schedule[0:t]). Steps before the
frontier have been executed and recorded; moving among them is moving a cursor. A value
needed at a position is taken from the store of versions (checkpoint/versions.py: the ring,
the lower tiers, a trace), or recomputed from its nearest retained ancestors and checked here
against the digest the write log recorded (a mismatch is non-determinism, reported, never
silently accepted). Mutated buffers live in fixed device memory: crossing their write tick
backwards restores the pre-image. A training Program has a checkpoint at the start of each of its steps
too (holding the parameters and optimizer state the step starts from), thinned by the ring as any other.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

from checkpoint.branch import ArchiveBefore, Branch, Patch, check_dtype
from checkpoint.ring import Ring
from checkpoint.steps import Edit, Step, edit_frame
from checkpoint.tiers import HostTier
from checkpoint.trace import TraceWriter
from checkpoint.versions import INITIAL, Archive, CheckpointInfo, Lookup, Tier, VersionStore, held_bytes
from hardware.driver import Driver, HostValues, WriteStats, capabilities, cast, clock, forget, seconds_between, \
    write_extent_of
from hardware.driver import check_batch as driver_check_batch
from hardware.errors import RewindError
from hardware.program import Node, Program
from hardware.stats_batch import WriteChecks
from hardware.ticks import Tick
from provenance.writelog import KIND_BUFFER, KIND_EDIT, KIND_NODE, KIND_VIEW, WriteLog

__all__ = ["INITIAL", "CheckpointInfo", "Edit", "Nondeterminism", "Step", "Timeline"]

T = TypeVar("T")


@dataclass(frozen=True)
class Nondeterminism:
    tick: Tick
    node: str
    value: str
    expected: int
    got: int

    def __str__(self) -> str:
        return (f"non-determinism at tick {self.tick}: node '{self.node}' rewrote '{self.value}' with digest "
                f"{self.got & 0xFFFFFFFFFFFFFFFF:016x}, recorded {self.expected & 0xFFFFFFFFFFFFFFFF:016x}")


class _Stored(Generic[T]):
    """A Timeline attribute that is its store's (read, and set where the store's may be)."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, timeline: "Timeline | None", owner: type | None = None) -> T:
        return getattr(timeline.store, self.name) if timeline is not None else self  # the class: the descriptor

    def __set__(self, timeline: "Timeline", value: T) -> None:
        setattr(timeline.store, self.name, value)


@dataclass(frozen=True)
class _NodePlan:
    """What executing a node at the frontier needs that the Program fixes, found once per node rather than per run."""

    node: Node
    # Per output: its name, the mutated buffer it writes (or None), and whether a later step reads it (ticks keep the
    # nodes' order, so an edit that moves them does not change that).
    writes: tuple[tuple[str, str | None, bool], ...]
    last_read: tuple[str, ...]  # the inputs no later step reads


class Timeline:
    # What the store keeps, as the Timeline's callers have always read it.
    ring: _Stored[Ring] = _Stored("ring")
    tiers: _Stored[Tier | None] = _Stored("tiers")  # where the ring spills (host lz4, then disk)
    archive: _Stored[Archive | None] = _Stored("archive")  # a trace's versions: loaded, not recomputed
    budget: _Stored[int] = _Stored("budget")  # bytes the ring may retain (the device pool's room, when less)
    initial: _Stored[Mapping[str, Any]] = _Stored("initial")
    physical: _Stored[dict[str, Any]] = _Stored("physical")
    buffer_source: _Stored[dict[str, str]] = _Stored("buffer_source")
    versions: _Stored[dict[str, list[Tick]]] = _Stored("versions")
    loaded: _Stored[int] = _Stored("loaded")  # versions brought back from the lower tiers
    recomputed: _Stored[int] = _Stored("recomputed")  # versions computed again by running their node

    def __init__(self, program: Program, driver: Driver, budget: int, every: int | None = None,
                 on_nondeterminism: Callable[[Nondeterminism], None] | None = None, tiers: HostTier | None = None,
                 recorder: TraceWriter | None = None, archive: Archive | None = None, check_batch: int | None = None,
                 device_pool: bool | None = None, fast_forward: bool = False):
        """`every`: checkpoint period in ticks (None: automatic); `tiers`: where the ring spills; `recorder`:
        continuous recording to a trace file; `archive`: a trace opened for reading; `check_batch`: writes whose
        on-device checks are read back together (None: the driver's); `device_pool`: retain copies in a
        preallocated device pool (None: as the driver prefers); `fast_forward`: run ahead (`run_ahead`) keeping only
        what the checkpoints need."""
        self.program, self.driver = program, driver
        self.on_nondeterminism = on_nondeterminism
        self.recorder = recorder
        self.check_batch, self.device_pool = check_batch, device_pool
        self.fast_forward = fast_forward
        self.position = Tick(0)
        self.frontier = Tick(0)
        self.chip = driver.describe()
        # What the driver's capabilities make of a node's marks and of a write's extent, found once: a run asks
        # for them at every node and every write.
        self._mark, self._extent = clock(driver), write_extent_of(driver)
        self.unit_names = [u.name for u in self.chip.units]
        self.schedule: list[Step] = [Step(0, n.index) for n in program.nodes]
        self.node_tick: list[Tick] = [Tick(i) for i in range(len(program.nodes))]
        self.store = VersionStore(self, program, driver, self.chip, budget, tiers, archive, device_pool)
        self.log = WriteLog(program, self.chip.name)
        batch = driver_check_batch(driver) if check_batch is None else check_batch
        self.checks = WriteChecks(driver, self.log, batch) if batch != 1 else None  # 1: each at once
        self.every = max(1, round(math.sqrt(len(program.nodes)))) if every is None else every
        self._step_starts = frozenset(program.step_starts[1:])  # nodes before which a checkpoint is taken
        self.nondeterminism: list[Nondeterminism] = []
        self.patches: dict[int, Patch] = {}  # node index -> how this branch runs it instead
        self._seconds: dict[Tick, float] = {}
        # tick -> the driver's marks before and after its node, not yet read (two dicts: no pair made per node)
        self._started: dict[Tick, Any] = {}
        self._ended: dict[Tick, Any] = {}
        self._branches: list[Branch] = []
        self._plans = [self._plan(node) for node in program.nodes]

    def _plan(self, node: Node) -> _NodePlan:
        tick, buffers = self.node_tick[node.index], self.store.buffer_source
        writes = tuple((name, buffers.get(name), self.last_use_tick(name) > tick) for name in node.outputs)
        values = self.program.values
        return _NodePlan(node, writes, tuple(n for n in node.input_names() if values[n].last_use == node.index))

    # -- time --------------------------------------------------------------------------
    @property
    def seconds(self) -> dict[Tick, float]:
        """tick -> how long its node ran on the chip when it was executed (the marks are read when asked)."""
        for tick in list(self._started):
            self.node_seconds(tick)
        return self._seconds

    @seconds.setter
    def seconds(self, seconds: dict[Tick, float]) -> None:
        self._started.clear()
        self._ended.clear()
        self._seconds = seconds

    def node_seconds(self, tick: Tick) -> float | None:
        started = self._started.pop(tick, None)
        if started is not None:
            self._seconds[tick] = seconds_between(self.driver, started, self._ended.pop(tick))
        return self._seconds.get(tick)

    @property
    def end(self) -> Tick:
        return Tick(len(self.schedule))

    def step_at(self, tick: Tick) -> Step | None:
        return self.schedule[tick] if 0 <= tick < len(self.schedule) else None

    def node_at(self, tick: Tick) -> Node | None:
        step = self.step_at(tick)
        return self.program.nodes[step.node] if step and step.node is not None else None

    def _starts_step(self, tick: Tick) -> bool:
        """Does a training step start at `tick` (its first node about to run)?"""
        step = self.step_at(tick)
        return step is not None and step.node in self._step_starts

    def unit_name(self, unit: int) -> str:
        return self.unit_names[unit]

    def last_use_tick(self, name: str) -> Tick:
        last = self.program.values[name].last_use
        return self.end if last >= len(self.program.nodes) else self.node_tick[last]

    def version_at(self, name: str, position: Tick) -> Tick | None:
        """Tick of the version of `name` that exists when `position` steps have run."""
        return self.store.version_at(name, position)

    def defined(self, position: Tick | None = None) -> list[str]:
        pos = self.position if position is None else position
        return [name for name in self.versions if self.version_at(name, pos) is not None]

    def live(self, position: Tick | None = None) -> list[str]:
        pos = self.position if position is None else position
        return [n for n in self.defined(pos) if pos <= self.last_use_tick(n)]

    # -- moving --------------------------------------------------------------------------
    def forward(self) -> Tick:
        """Move one step forward, executing it if it was never run. Returns the step's tick."""
        if self.position >= self.end:
            raise RewindError("already at the end of the program")
        tick = self.position
        if tick == self.frontier:
            self._execute(tick)
            self.frontier = Tick(self.frontier + 1)
        self.position = Tick(tick + 1)
        self.store.sync_buffers(self.position)
        return tick

    def seek(self, tick: Tick) -> None:
        """Go to `tick` (0 .. end); executes the steps between the frontier and it if needed."""
        if not 0 <= tick <= self.end:
            raise RewindError(f"tick {tick} is outside the timeline (0..{self.end})")
        while self.frontier < tick:
            self.position = self.frontier
            self.forward()
        self.position = tick
        self.store.sync_buffers(self.position)

    def run_ahead(self, stop: Tick) -> None:
        """Execute the steps from the frontier to `stop`, leaving the position where it is: a stretch where nothing
        can stop (the caller knows: hardware/session/fast_forward.py). With `fast_forward` each step keeps only its
        write log row (digest, NaN/Inf counts, min/max/sum: the fused checks) and the values later steps read; the
        ring retains the values live at each checkpoint, and any other value is recomputed from the checkpoint
        before it when asked (checkpoint/versions.py), as rr replays. Without it, as `forward` executes them (the
        ring choosing what to keep by each step's distance from the frontier, as it always has)."""
        stop = min(stop, self.end)
        if self.frontier >= stop:
            return
        if not self.fast_forward or self.recorder is not None:  # a recording writes every version
            here = self.position
            self.seek(stop)
            self.seek(here)
            return
        start = tick = self.frontier
        while tick < stop:
            self._execute(tick, retain=False)
            tick = self.frontier = Tick(tick + 1)  # a step that fails leaves the frontier before it
        self.store.ran_ahead(start, stop)
        self.store.sync_buffers(self.position)

    def forget_ahead(self, tick: Tick) -> None:
        """Forget the steps executed from `tick` (at or after the position) on, without moving: a stretch ran past
        where its motion stopped."""
        self._truncate(max(tick, self.position))

    def record_through(self, tick: Tick | None = None) -> None:
        """Execute the steps up to `tick` (default: the end) the pass has not run yet, leaving the position where
        it was: the write log and the values exist from then on."""
        tick = self.end if tick is None else tick
        if self.frontier < tick:
            here = self.position
            self.run_ahead(tick)
            self.seek(here)

    # -- values (the store's) ------------------------------------------------------------------
    def value(self, name: str, position: Tick | None = None) -> Any:
        """The tensor `name` holds when `position` steps have run (materialised if evicted); a copy of one that
        lives in the checkpoint pool."""
        return self.store.value(name, self.position if position is None else position)

    def resident(self, name: str, position: Tick | None = None) -> Any:
        """The tensor the engine holds for `name` at `position`, a pool slot included: for asking where it lives,
        not for keeping (`value` is for that)."""
        return self.store.resident(name, self.position if position is None else position)

    def value_version(self, name: str, version: Tick) -> Any:
        return self.store.value_version(name, version)

    def checkpoints(self) -> list[CheckpointInfo]:
        return self.store.checkpoints()

    # -- running nodes -------------------------------------------------------------------------
    def check_digests(self, node: Node, tick: Tick, outputs: list[Any]) -> None:
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

    def replay_check(self, start: Tick = Tick(0), stop: Tick | None = None) -> list[Nondeterminism]:
        """Re-run the executed node steps in [start, stop) from their recorded inputs, checking every
        write's digest. Returns the non-determinism found (each also reported as it is found)."""
        stop = self.frontier if stop is None else min(stop, self.frontier)
        found = len(self.nondeterminism)
        for tick in range(max(0, start), stop):
            node = self.node_at(Tick(tick))
            if node is None:
                continue
            try:
                outputs = self.run_node_at(node, Tick(tick), lambda k: self.value_version(*k))
                self.check_digests(node, Tick(tick), outputs)
            finally:
                self.store.release()
        return self.nondeterminism[found:]

    def run_node_at(self, node: Node, tick: Tick, lookup: Lookup) -> list[Any]:
        """Run the node of `tick` with the versions of its inputs that exist then, as `lookup` gives them."""
        return self.run_node(node, lambda n: lookup((n, self.version_at(n, tick))))

    def run_node(self, node: Node, value_of: Callable[[str], Any]) -> list[Any]:
        """Run one node on the driver with the inputs `value_of` gives, as this branch runs it."""
        patches = self.patches
        patch = patches.get(node.index) if patches else None
        if patches and patch is None:  # a patched producer may have written another dtype
            given = value_of
            value_of = lambda n: cast(self.driver, given(n), self.program.values[n].dtype)  # noqa: E731
        elif patch is not None and HostValues in capabilities(self.driver):
            # The Program's own tensors at the pass's precision (a wider pass widens them where its nodes read them):
            # a patch runs outside the driver's nodes and gets them as a node does.
            given, initial = value_of, self.program.initial
            value_of = lambda n: cast(self.driver, given(n), self.program.values[n].dtype) if n in initial \
                else given(n)  # noqa: E731
        args, kwargs = node.bind(value_of)
        try:
            if patch is None:
                return self.driver.execute(node, args, kwargs)
            outputs = patch.run(self.driver, node, args, kwargs)
        except Exception as exc:
            raise RewindError(f"{node.describe()} failed on {self.driver.name}: {exc}") from exc
        return self._patched_outputs(node, patch, outputs)

    def _patched_outputs(self, node: Node, patch: Patch, outputs: list[Any]) -> list[Any]:
        """A patch changes how a node computes, never the shapes of what it writes (nor, but for a precision
        patch, their dtypes)."""
        for name, tensor in zip(node.outputs, outputs):
            want = self.program.values[name]
            if tuple(tensor.shape) != want.shape:
                raise RewindError(f"{node.describe()} {patch.describe()} wrote '{name}' with shape "
                                  f"{list(tensor.shape)}; the program's is {list(want.shape)}")
            check_dtype(self.driver, node, patch, name, tensor, want.dtype)
        return outputs

    # -- executing at the frontier -------------------------------------------------------------
    def _execute(self, tick: Tick, retain: bool = True) -> None:
        """Run the step of `tick`, log its writes, keep its values (not `retain`: only those later steps read, as
        `run_ahead` says)."""
        step = self.schedule[tick]
        unit = self.unit_names[step.unit]
        store = self.store
        try:
            if self.recorder is not None:
                self.recorder.step(tick, step.unit, step.node, edit_frame(step.edit))
            if step.edit is not None:
                edited = store.apply_edit(step.edit, tick)
                self._record(tick, None, step.edit.value, KIND_EDIT, edited, unit)
                return
            plan = self._plans[step.node]
            read: list[Any] = []
            started = self._mark()
            outputs = self.run_node(plan.node, store.reader(tick, read))
            self._started[tick], self._ended[tick] = started, self._mark()
            storage = self.driver.storage
            read_storages = {storage(t)[0] for t in read if hasattr(t, "untyped_storage")}
            for (name, buf, read_later), tensor in zip(plan.writes, outputs):
                place = storage(tensor)  # a view's is what it views: it writes no memory of its own
                kind = KIND_VIEW if place[0] in read_storages else KIND_NODE
                self._record(tick, step.node, name, kind, tensor, unit, read_later, place, retain)
                if buf is not None:
                    memory = store.write_buffer(buf, tick, tensor)
                    row = self._log_write(tick, unit, step.node, buf, KIND_BUFFER,
                                          self._extent(buf, memory, unit), tensor)
                    if self.recorder is not None:
                        self.recorder.write(self.log.row(row))
            store.read_last(plan.last_read, tick)
            if (tick + 1) % self.every == 0 or (self._step_starts and self._starts_step(Tick(tick + 1))):
                pins = store.checkpoint(Tick(tick + 1), retain)
                if self.recorder is not None:
                    self.recorder.checkpoint(tick + 1, sorted(pins))
        finally:
            store.release()

    def _record(self, tick: Tick, node: int | None, name: str, kind: int, tensor: Any, unit: str,
                read_later: bool | None = None, place: tuple[Any, int] | None = None, retain: bool = True) -> None:
        """Log and keep one write (`read_later`, `place`, `retain`: VersionStore.written's, when the caller has
        them)."""
        row = self._log_write(tick, unit, node, name, kind, self._extent(name, tensor, unit), tensor)
        self.store.written(name, tick, tensor, read_later, place, retain)
        if self.recorder is not None:
            self.recorder.write(self.log.row(row))
            if kind != KIND_VIEW:  # a view is recomputed from what it views, without the device
                self.recorder.version(name, tick, tensor)

    def _log_write(self, tick: Tick, unit: str, node: int | None, name: str, kind: int,
                   extent: tuple[str, int, int], tensor: Any) -> int:
        """Log one write (its memory space, address and bytes) with its checks; batched, they run on the device and
        fill the row when their batch lands."""
        if kind == KIND_VIEW or self.checks is None:
            stats = WriteStats.empty() if kind == KIND_VIEW else self.driver.inspect(tensor)
            return self.log.add(tick, unit, node, name, kind, *extent, stats)
        row = self.log.add(tick, unit, node, name, kind, *extent, None)
        self.checks.add(row, tick, tensor)
        return row

    # -- edits ---------------------------------------------------------------------------------
    def edit(self, value: str, offset: int, data: bytes, description: str = "") -> Tick:
        """Write bytes into `value` at the position: a new step that rewrites the future."""
        pos = self.position
        if self.version_at(value, pos) is None:
            raise RewindError(f"'{value}' does not exist at tick {pos}")
        self._truncate(pos)
        self.schedule.insert(pos, Step(0, None, Edit(value, offset, data, description)))
        self.node_tick = [Tick(t + 1) if t >= pos else t for t in self.node_tick]
        self.forward()
        return pos

    def reexecute_from(self, tick: Tick) -> None:
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
        held = self.store.held_buffers(origin, sum(held_bytes(self.driver, (t for _, t in br.buffers.values()))
                                                   for br in self._branches))
        tick = min(self.node_tick[p.node] for p in patches)
        self.seek(tick)
        saved = Branch(tick, origin, self.frontier, dict(self.patches), self.log.tail(tick),
                       {n: ticks[bisect.bisect_left(ticks, tick):] for n, ticks in self.versions.items()},
                       list(self.schedule), list(self.node_tick), self.recorder, self.archive,
                       {t: s for t, s in self.seconds.items() if t >= tick}, held)
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
        self._truncate(branch.tick, sync=False)  # the buffers are synced once, where the branch began
        self.patches, self.schedule, self.node_tick = branch.patches, branch.schedule, branch.node_tick
        self.log.extend(branch.log)
        for name, ticks in branch.versions.items():
            self.versions[name].extend(ticks)
        self.store.resync()
        self.store.put_back_buffers(branch.buffers, branch.position)
        self.seconds.update(branch.seconds)
        self.frontier = branch.frontier
        self.recorder, self.archive = branch.recorder, branch.archive
        self.seek(branch.position)

    def _truncate(self, tick: Tick, sync: bool = True) -> None:
        """Forget everything recorded at or after `tick`: the future is about to change (the buffers are made to
        hold the position's versions unless `sync` is False: the caller syncs them)."""
        if self.frontier <= tick:
            return
        self.log.truncate(tick)
        self.store.truncate(tick)
        if self.recorder is not None:
            self.recorder.truncate(tick)
        self.seconds = {t: s for t, s in self.seconds.items() if t < tick}
        forget(self.driver, [s.node for s in self.schedule[tick:self.frontier] if s.node is not None])
        self.frontier = tick
        if sync:
            self.store.sync_buffers(self.position)

    def close(self) -> None:
        """The session ended: the lower tiers' files go, and the memory of the versions the ring retains goes back to
        the allocator now, not when the garbage collector next finds this Timeline's reference cycles: a relaunch, or
        the next session in the process, computes into pages already mapped instead of faulting in fresh ones (and on
        a GPU finds the device pool's memory free). A value read afterwards is recomputed."""
        if self.tiers is not None:
            self.tiers.close()
        self.store.let_go()

    def forget_from(self, tick: Tick) -> None:
        """Forget the recorded run from `tick` on (a driver's node will run differently): its steps
        execute again when next reached."""
        self.seek(min(tick, self.frontier))
        self._truncate(tick)
