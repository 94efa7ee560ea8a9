"""One node running on the chip: units, their synchronisation, and the scheduler that interleaves them.

A step is one instruction of one core, or one transfer of one DMA engine. Which unit takes each
step is the Schedule: chosen by the policy (round-robin, or random from a seed) the first time,
and replayed from the record afterwards, so the interleaving, and with it every race's outcome,
is reproduced bit for bit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from hardware.drivers.sim import alu
from hardware.drivers.sim.chip import ChipConfig, Memories
from hardware.drivers.sim.isa import Access, Buffer, Instr
from hardware.drivers.sim.kernel import Kernel
from hardware.drivers.sim.races import Conflict, RaceDetector
from hardware.errors import RewindError

POLICIES = ("round-robin", "random")


class ReplayError(RewindError):
    """A recorded schedule names a unit that cannot run at that step."""


@dataclass
class Transfer:
    """A DMA transfer queued by a core: its clock is the issuing core's at issue."""

    ins: Instr
    core: int
    pc: int
    clocks: np.ndarray


@dataclass(frozen=True)
class MemoryEdit:
    """A user's write into chip memory while stopped inside a node, applied before step `step`."""

    step: int
    space: str
    core: int | None
    offset: int
    data: bytes


@dataclass(frozen=True)
class Wait:
    """What a blocked core waits for, since which step."""

    core: int
    kind: str  # "barrier", "semaphore", "dma"
    ident: int
    since: int
    waiting_for: tuple[int, ...]  # the units that could release it (cores for barriers and semaphores, a DMA engine)
    detail: str


@dataclass
class Scheduler:
    policy: str
    seed: int
    node: int
    prefix: np.ndarray | None = None  # the recorded (or forced) agents of the first steps
    _last: int = -1
    _rng: np.random.Generator | None = field(default=None, repr=False)

    def choose(self, step: int, runnable: list[int]) -> int:
        if self.prefix is not None and step < len(self.prefix):
            agent = int(self.prefix[step])
            if agent not in runnable:
                raise ReplayError(f"the recorded schedule runs unit {agent} at step {step} of node {self.node}, "
                                  f"which cannot run there (runnable: {runnable})")
        elif self.policy == "random":
            if self._rng is None:
                self._rng = np.random.default_rng([self.seed, self.node])
            agent = runnable[int(self._rng.integers(len(runnable)))]
        else:
            later = [a for a in runnable if a > self._last]
            agent = later[0] if later else runnable[0]
        self._last = agent
        return agent


class NodeRun:
    """The chip running one kernel from its node-start state, step by step."""

    def __init__(self, config: ChipConfig, memories: Memories, kernel: Kernel, scheduler: Scheduler,
                 edits: tuple[MemoryEdit, ...] = ()):
        self.config, self.memories, self.kernel, self.scheduler = config, memories, kernel, scheduler
        cores, agents = config.cores, config.agents
        self.pc = [0] * cores
        self.halted = [not stream for stream in kernel.programs]
        self._live = [c for c in range(cores) if not self.halted[c]]  # cores that have not halted
        self.at_barrier: list[int | None] = [None] * cores
        self.since = [0] * cores  # the step at which each core reached its current instruction
        self.queues: list[deque[Transfer]] = [deque() for _ in range(cores)]
        self.pending = [dict() for _ in range(cores)]  # tag -> transfers in flight
        self.done_clocks: list[dict[int, np.ndarray]] = [dict() for _ in range(cores)]
        self.arrived: dict[int, list[int]] = {b: [] for b in kernel.barriers}
        self.barrier_clocks = {b: np.zeros(agents, np.int32) for b in kernel.barriers}
        self.sem_count = [0] * kernel.semaphores
        self.sem_clocks = [np.zeros(agents, np.int32) for _ in range(kernel.semaphores)]
        self.clocks = np.zeros((agents, agents), np.int32)
        self.races = RaceDetector()
        self.conflicts: list[Conflict] = []
        self.agents: list[int] = []
        self.pcs: list[int] = []
        self.edits = {}
        for e in edits:
            self.edits.setdefault(e.step, []).append(e)

    # -- scheduling ------------------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        return len(self.agents)

    @property
    def finished(self) -> bool:
        return all(self.halted) and not any(self.queues)

    def runnable(self) -> list[int]:
        cores = self.config.cores
        out = [c for c in self._live if self._core_can_run(c)]
        return out + [cores + c for c, queue in enumerate(self.queues) if queue]

    def _core_can_run(self, core: int) -> bool:
        if self.at_barrier[core] is not None:
            return False
        ins = self.kernel.programs[core][self.pc[core]]
        if ins.op == "dma.wait":
            return not self.pending[core].get(ins.tag)
        if ins.op == "wait":
            return self.sem_count[ins.tag] > 0
        return True

    def step(self) -> int | None:
        """Run one step of the unit the schedule picks; None when no unit can run (finished, or hung)."""
        runnable = self.runnable()
        if not runnable:
            return None
        k = self.step_count
        self._apply_edits()
        agent = self.scheduler.choose(k, runnable)
        self.clocks[agent, agent] += 1
        cores = self.config.cores
        pc = self._core_step(agent, k) if agent < cores else self._dma_step(agent - cores, k)
        self.agents.append(agent)
        self.pcs.append(pc)
        return agent

    def run(self, steps: int | None = None) -> None:
        """Run until finished, hung, or `steps` more steps have run."""
        target = None if steps is None else self.step_count + steps
        while (target is None or self.step_count < target) and self.step() is not None:
            pass
        self._apply_edits()

    def _apply_edits(self) -> None:
        """The user's writes due once this many steps have run (each applied once)."""
        for edit in self.edits.pop(self.step_count, ()):
            backing = self.memories.backing(edit.space, edit.core)
            backing[edit.offset:edit.offset + len(edit.data)] = np.frombuffer(edit.data, np.uint8)

    # -- cores ------------------------------------------------------------------------------------
    def _core_step(self, core: int, k: int) -> int:
        pc = self.pc[core]
        ins = self.kernel.programs[core][pc]
        self.pc[core] = pc + 1
        self.since[core] = k + 1
        handler = _CORE.get(ins.op) or _CORE[ins.op.split(".")[0]]
        handler(self, core, ins, k)
        return pc

    def _issue(self, core: int, ins: Instr, k: int) -> None:
        self.queues[core].append(Transfer(ins, core, self.pc[core] - 1, self.clocks[core].copy()))
        self.pending[core][ins.tag] = self.pending[core].get(ins.tag, 0) + 1

    def _dma_wait(self, core: int, ins: Instr, k: int) -> None:
        done = self.done_clocks[core].get(ins.tag)
        if done is not None:
            np.maximum(self.clocks[core], done, out=self.clocks[core])

    def _barrier(self, core: int, ins: Instr, k: int) -> None:
        b = ins.tag
        np.maximum(self.barrier_clocks[b], self.clocks[core], out=self.barrier_clocks[b])
        self.arrived[b].append(core)
        if len(self.arrived[b]) < self.kernel.barriers[b]:
            self.at_barrier[core] = b
            return
        for c in self.arrived[b]:  # the last arrival releases the gang; all leave with everyone's clock
            np.maximum(self.clocks[c], self.barrier_clocks[b], out=self.clocks[c])
            self.at_barrier[c] = None
            self.since[c] = k + 1
        self.arrived[b] = []
        self.barrier_clocks[b] = np.zeros_like(self.barrier_clocks[b])

    def _signal(self, core: int, ins: Instr, k: int) -> None:
        np.maximum(self.sem_clocks[ins.tag], self.clocks[core], out=self.sem_clocks[ins.tag])
        self.sem_count[ins.tag] += int(ins.imm[0])

    def _sem_wait(self, core: int, ins: Instr, k: int) -> None:
        self.sem_count[ins.tag] -= 1
        np.maximum(self.clocks[core], self.sem_clocks[ins.tag], out=self.clocks[core])

    def _halt(self, core: int, ins: Instr, k: int) -> None:
        self.halted[core] = True
        self._live.remove(core)

    def _compute(self, core: int, ins: Instr, k: int) -> None:
        sources = [self._read(core, s, k) if isinstance(s, Buffer) else s for s in ins.srcs]
        dst = ins.dst.tile()
        op = ins.op
        kind, _, name = op.partition(".")
        if kind == "vec" and name in alu.UNARY:
            alu.unary(name, dst, sources[0])
        elif kind == "vec":
            alu.binary(name, dst, sources[0], sources[1])
        elif kind == "red":
            alu.reduce(name, dst, sources[0])
        elif kind == "mm":
            alu.matmul(dst, sources[0], sources[1], accumulate=name == "acc")
        elif op == "cvt":
            alu.store(dst, sources[0])
        elif op == "sel":
            alu.select(dst, *sources)
        elif op == "fill":
            dst[...] = ins.imm[0]
        elif op == "mask.tri":
            alu.triangle(dst, sources[0], *ins.imm)
        self._check(ins.dst, None, core, k, write=True)

    def _atomic_add(self, core: int, ins: Instr, k: int) -> None:
        tile = self._read(core, ins.srcs[0], k)
        target: Access = ins.dst
        self._check(target.buffer, target.index, core, k, write=True, atomic=True)
        flat = target.buffer.flat
        total = np.empty_like(flat[target.index])
        alu.binary("add", total, flat[target.index], tile.reshape(-1))
        flat[target.index] = total

    def _read(self, agent: int, buffer: Buffer, k: int) -> np.ndarray:
        self._check(buffer, None, agent, k, write=False)
        return buffer.tile()

    def _check(self, buffer: Buffer, index, agent: int, k: int, write: bool, atomic: bool = False) -> None:
        found = self.races.access(buffer, slice(None) if index is None else index, agent, self.clocks[agent], k,
                                  write, atomic)
        if found is not None:
            self.conflicts.append(found)

    # -- DMA engines --------------------------------------------------------------------------------
    def _dma_step(self, engine: int, k: int) -> int:
        agent = self.config.cores + engine
        t = self.queues[engine].popleft()
        clocks = self.clocks[agent]
        np.maximum(clocks, t.clocks, out=clocks)
        ins = t.ins
        if ins.op == "dma.gather":
            self._gather(agent, ins, k)
        else:
            dst = ins.dst if isinstance(ins.dst, Access) else Access(ins.dst)
            src = ins.srcs[0] if isinstance(ins.srcs[0], Access) else Access(ins.srcs[0])
            self._check(src.buffer, src.index, agent, k, write=False)
            self._check(dst.buffer, dst.index, agent, k, write=True)
            dst.buffer.flat[dst.indices()] = src.buffer.flat[src.indices()]
        self.pending[engine][ins.tag] -= 1
        done = self.done_clocks[engine].setdefault(ins.tag, np.zeros_like(clocks))
        np.maximum(done, clocks, out=done)
        return t.pc

    def _gather(self, agent: int, ins: Instr, k: int) -> None:
        """Rows of a DRAM table, picked by the indices in a local tile, into a local tile."""
        table, rows = ins.srcs
        c0, c1 = ins.imm
        self._check(rows, None, agent, k, write=False)
        ids = rows.flat.astype(np.int64)
        height = table.buffer.shape[0]
        width = table.buffer.numel // max(height, 1)
        bad = ids[(ids < 0) | (ids >= height)]
        if len(bad):
            raise RewindError(f"{self.config.agent_name(agent)}: gather index {int(bad[0])} is outside the table "
                              f"'{table.buffer.label}' of {height} rows")
        index = (ids[:, None] * width + np.arange(c0, c1)[None, :]).ravel()
        self._check(table.buffer, index, agent, k, write=False)
        self._check(ins.dst, None, agent, k, write=True)
        ins.dst.flat[:] = table.buffer.flat[index]

    # -- what blocks whom ---------------------------------------------------------------------------
    def wait_of(self, core: int) -> Wait | None:
        if self.halted[core]:
            return None
        b = self.at_barrier[core]
        if b is not None:
            arrived = self.arrived[b]
            missing = tuple(c for c in self._barrier_members(b) if c not in arrived)
            short = self.kernel.barriers[b] - len(arrived) - len(missing)
            nobody = f"; {short} more that no unit will make" if short > 0 else ""
            return Wait(core, "barrier", b, self.since[core], missing,
                        f"at barrier {b}: {len(arrived)} of {self.kernel.barriers[b]} arrived{nobody}")
        ins = self.kernel.programs[core][self.pc[core]]
        if ins.op == "wait" and not self.sem_count[ins.tag]:
            signallers = tuple(c for c in range(self.config.cores) if any(
                i.op == "sig" and i.tag == ins.tag for i in self.kernel.programs[c][self.pc[c]:]))
            who = f"signalled by {', '.join(self.config.agent_name(c) for c in signallers)}" if signallers \
                else "that no unit will signal"
            return Wait(core, "semaphore", ins.tag, self.since[core], signallers, f"on semaphore {ins.tag}, {who}")
        if ins.op == "dma.wait" and self.pending[core].get(ins.tag):
            return Wait(core, "dma", ins.tag, self.since[core], (self.config.cores + core,),
                        f"on DMA tag {ins.tag} ({self.pending[core][ins.tag]} transfers in flight)")
        return None

    def _barrier_members(self, barrier: int) -> list[int]:
        """Cores whose stream arrives at this barrier (whether or not they got there)."""
        return [c for c in range(self.config.cores) if any(i.op == "bar" and i.tag == barrier
                                                           for i in self.kernel.programs[c])]

    def waits(self) -> list[Wait]:
        return [w for c in range(self.config.cores) if (w := self.wait_of(c)) is not None]


_CORE = {
    "dma": NodeRun._issue, "dma.wait": NodeRun._dma_wait, "bar": NodeRun._barrier, "sig": NodeRun._signal,
    "wait": NodeRun._sem_wait, "halt": NodeRun._halt, "atom.add": NodeRun._atomic_add,
    "vec": NodeRun._compute, "red": NodeRun._compute, "mm": NodeRun._compute, "cvt": NodeRun._compute,
    "sel": NodeRun._compute, "fill": NodeRun._compute, "mask": NodeRun._compute,
}
