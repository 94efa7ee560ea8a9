"""The `sim` driver: Program nodes run as interleaved instruction streams on a simulated many-core chip.

Values cross to the host after each node (the host reads the outputs back from DRAM), so the
Timeline retains them like any driver's; digests and stats are computed on that copy. The chip's
own memory persists from node to node in program order (the "frontier" state). Each node's first
run saves the pre-images of what it may write (its node-start checkpoint, a delta) and its
Schedule; any later run of it (a recomputation, or stepping inside it) restores that checkpoint,
replays the Schedule, and puts the frontier state back afterwards.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from hardware import tensor_checks, torch_tensors
from hardware.driver import Chip, Driver, WriteStats
from hardware.drivers.sim.chip import ChipConfig, Memories, config_from_spec
from hardware.drivers.sim.delta import Delta
from hardware.drivers.sim.faults import Fault, parse_faults
from hardware.drivers.sim.kernel import Kernel, MemoryPlan, strides
from hardware.drivers.sim.lowering import lower_program
from hardware.drivers.sim.machine import POLICIES, MemoryEdit, NodeRun, ReplayError, Scheduler
from hardware.drivers.sim.state import SimChipState, hang_report, race_reports, shards_of
from hardware.errors import DriverError
from hardware.instructions import (ChipState, InstructionDriver, InstructionInfo, MemoryRegion, NodeSchedule)
from hardware.memory import Location
from hardware.program import Node, Program, Ref
from hardware.torch_tensors import TensorBytes


@dataclass
class _Record:
    """What a node's first run left: its Schedule, its node-start checkpoint, its findings."""

    agents: np.ndarray
    start: Delta
    schedule: NodeSchedule
    edits: tuple[MemoryEdit, ...]


@dataclass
class _Side:
    """A run inside a node opened for inspection; `saved` is the frontier state it displaced."""

    node: int
    run: NodeRun
    saved: Delta


class SimDriver(TensorBytes, Driver, InstructionDriver):
    def __init__(self, config: ChipConfig, seed: int = 0, schedule: str = "round-robin",
                 faults: list[Fault] | None = None):
        if schedule not in POLICIES:
            raise DriverError(f"unknown schedule '{schedule}' (known: {', '.join(POLICIES)})")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise DriverError(f"seed must be an integer, got {seed!r}")
        self.config, self.seed, self.policy = config, seed, schedule
        self.faults = faults or []
        self.name = f"sim:{config.name}"
        torch_tensors.keep_freed_memory()  # values cross to the host, where the ring retains them
        self.program: Program | None = None
        self.plan: MemoryPlan | None = None
        self.kernels: list[Kernel] = []
        self.memories: Memories | None = None
        self.records: dict[int, _Record] = {}
        self.order: list[int] = []  # nodes in the order of their first runs
        self.pending: dict[int, tuple[np.ndarray, tuple[MemoryEdit, ...]]] = {}
        self._side: _Side | None = None
        self._shards: dict[str, tuple[Location, ...]] = {}
        self._layouts: dict[tuple, tuple[list[int], list]] = {}
        self.steps_run = 0  # every simulated step, replays included

    @classmethod
    def from_spec(cls, spec: str, options: Mapping[str, Any] | None = None) -> "SimDriver":
        options = dict(options or {})
        config = config_from_spec(spec)
        return cls(config, options.get("seed", 0), options.get("schedule", "round-robin"),
                   parse_faults(options.get("faults"), config))

    def describe(self) -> Chip:
        return self.config.describe()

    # -- loading ----------------------------------------------------------------------------------
    def load(self, program: Program) -> dict[str, Any]:
        self.program = program
        self.plan, self.kernels = lower_program(self.config, program, self.faults)
        self.memories = Memories(self.config, self.plan.dram_bytes)
        for buf in self.plan.buffers.values():
            buf.bind(self.memories.dram)
        for kernel in self.kernels:
            for buf in kernel.scratch:
                buf.bind(self.memories.dram)
            for tile in kernel.tiles:
                tile.bind(self.memories.local[tile.core])
        initial = {}
        for name, tensor in program.initial.items():
            host = tensor.detach().contiguous().clone()
            _write(self.plan.buffers[name], host)
            initial[name] = host
        return initial

    # -- running ------------------------------------------------------------------------------------
    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        self._close_side()
        kernel = self.kernels[node.index]
        record = self.records.get(node.index)
        if record is None:
            return self._first_run(node, kernel, args, kwargs)
        run, saved = self._replay(node, kernel, args, kwargs, record, None)
        if run.agents != list(record.agents):
            raise ReplayError(f"{node.describe()} did not replay its recorded schedule")
        outputs = self._outputs(node, kernel)
        saved.restore(self.memories)
        return outputs

    def _first_run(self, node: Node, kernel: Kernel, args: tuple, kwargs: dict) -> list[Any]:
        self._write_inputs(node, args, kwargs)
        start = Delta(self.memories, kernel.write_set(), compress=True)
        prefix, edits = self.pending.pop(node.index, (None, ()))
        run = self._run(node, kernel, prefix, edits)
        run.run()
        self.steps_run += run.step_count
        pcs = np.array(run.pcs, np.int32)
        schedule = NodeSchedule(np.array(run.agents, np.int16) + 1, pcs, race_reports(run, pcs),
                                hang_report(run))
        self.records[node.index] = _Record(np.array(run.agents, np.int16), start, schedule, edits)
        self.order.append(node.index)
        return self._outputs(node, kernel)

    def _replay(self, node: Node, kernel: Kernel, args: tuple, kwargs: dict, record: _Record,
                steps: int | None) -> tuple[NodeRun, Delta]:
        inputs = [("DRAM", None, b.offset, b.offset + b.nbytes) for b in kernel.inputs]
        saved = Delta(self.memories, kernel.write_set() + inputs)
        record.start.restore(self.memories)
        self._write_inputs(node, args, kwargs)
        run = self._run(node, kernel, record.agents, record.edits)
        run.run(steps)
        self.steps_run += run.step_count
        return run, saved

    def _run(self, node: Node, kernel: Kernel, prefix, edits) -> NodeRun:
        scheduler = Scheduler(self.policy, self.seed, node.index, prefix)
        return NodeRun(self.config, self.memories, kernel, scheduler, tuple(edits))

    def _write_inputs(self, node: Node, args: tuple, kwargs: dict) -> None:
        for name, tensor in _bound(node, args, kwargs).items():
            _write(self.plan.buffers[name], tensor)

    def _outputs(self, node: Node, kernel: Kernel) -> list[torch.Tensor]:
        out = []
        for name, buf in zip(node.outputs, kernel.outputs):
            raw = torch.from_numpy(buf.flat.view(np.uint8).copy())
            out.append(raw.view(getattr(torch, self.program.values[name].dtype)).reshape(buf.shape))
        return out

    def _close_side(self) -> None:
        if self._side is not None:
            self._side.saved.restore(self.memories)
            self._side = None

    def forget(self, nodes: list[int]) -> None:
        """Undo the forgotten nodes' first runs (newest first): the frontier state goes back to before them."""
        self._close_side()
        gone = set(nodes)
        for index in reversed([i for i in self.order if i in gone]):
            self.records.pop(index).start.restore(self.memories)
            self.pending.pop(index, None)
        self.order = [i for i in self.order if i not in gone]

    # -- where values live ---------------------------------------------------------------------------
    def locate(self, tensor: Any, unit: str | None = None) -> Location:
        """A tensor not known by value name: its host copy."""
        return torch_tensors.locate(tensor, unit or "host")

    def locate_value(self, name: str, tensor: Any, unit: str | None = None) -> Location:
        buf = self.plan.buffers[name]
        return Location(self.name, unit or "host", "DRAM", buf.address, buf.nbytes, str(buf.dtype), buf.shape,
                        strides(buf.shape), elements=buf.elements)

    def placement(self, name: str, tensor: Any) -> tuple[Location, ...]:
        """One shard per core that stores part of the value (the value viewed as [rows, last dim])."""
        if name not in self._shards:
            info = self.program.values[name]
            kernel = self.kernels[info.producer] if info.producer is not None else None
            found = shards_of(self.config, self.plan.buffers[name], kernel) if kernel else ()
            self._shards[name] = found or (self.locate_value(name, tensor),)
        return self._shards[name]

    # -- host copies of values -------------------------------------------------------------------------
    def inspect(self, tensor: Any) -> WriteStats:
        return tensor_checks.inspect(tensor)

    # Values are host tensors: forensics compares them with a reference as they are (HostValues).
    def to_host(self, tensor: Any) -> Any:
        return torch_tensors.to_host(tensor)

    def from_host(self, tensor: Any) -> Any:
        return torch_tensors.from_host(tensor, _HOST)

    def cast(self, tensor: Any, dtype: str) -> Any:
        return torch_tensors.cast(tensor, dtype)

    # -- instruction level -------------------------------------------------------------------------------
    def schedule(self, node: int) -> NodeSchedule | None:
        record = self.records.get(node)
        return record.schedule if record else None

    def chip_at(self, node: Node, args: tuple, kwargs: dict, step: int) -> ChipState:
        side = self._side
        if side is None or side.node != node.index or side.run.step_count > step:
            self._close_side()
            record = self.records.get(node.index)
            if record is None:
                raise DriverError(f"{node.describe()} has not run yet")
            run, saved = self._replay(node, self.kernels[node.index], args, kwargs, record, 0)
            side = self._side = _Side(node.index, run, saved)
        before = side.run.step_count
        side.run.run(step - before)
        self.steps_run += side.run.step_count - before
        return SimChipState(self.config, self.memories, self.name, side.run)

    def memory_before(self, node: int, address: int, count: int) -> bytes:
        """The frontier memory (what an open run displaced, put back) with the checkpoints of this node and
        every later one applied, newest first."""
        where = self.memories.resolve(address)
        if where is None:
            raise DriverError(f"no memory is mapped at {address:#x}")
        space, core, offset = where
        out = self.memories.backing(space, core)[offset:offset + count].copy()
        layers = [self._side.saved] if self._side is not None else []
        layers += [self.records[i].start for i in reversed(self.order) if i >= node]
        for saved in layers:
            for s_space, s_core, s_offset, data in saved.parts():
                if (s_space == "DRAM") == (space == "DRAM") and s_core == core:
                    _overlay(out, offset, data, s_offset)
        return out.tobytes()

    def region(self, address: int, node: int | None) -> MemoryRegion | None:
        where = self.memories.resolve(address)
        if where is None:
            return None
        space, core, offset = where
        starts, buffers = self._layout(node, space, core)
        i = bisect.bisect_right(starts, offset) - 1
        local = space != "DRAM"
        if i >= 0 and offset < buffers[i].offset + buffers[i].nbytes:
            buf = buffers[i]
            value = buf.value if not local and buf.label == buf.value else None
            return MemoryRegion(space, core, self.config.bank_of(buf.offset) if local else None, buf.address,
                                buf.nbytes, buf.label, value)
        limit = len(self.memories.backing(space, core))
        gap_end = starts[i + 1] if i + 1 < len(starts) else limit
        if local:  # a gap is reported up to the end of its bank at most
            gap_end = min(gap_end, (self.config.bank_of(offset) + 1) * self.config.bank_bytes)
        return MemoryRegion(space, core, self.config.bank_of(offset) if local else None, address, gap_end - offset)

    def _layout(self, node: int | None, space: str, core: int | None) -> tuple[list[int], list]:
        """The buffers of one memory in the node (DRAM: every value and the node's scratch), by offset."""
        key = (node, space, core)
        if key not in self._layouts:
            kernel = self.kernels[node] if node is not None and node < len(self.kernels) else None
            if space == "DRAM":
                found = list(self.plan.buffers.values()) + (kernel.scratch if kernel else [])
            else:
                found = [t for t in (kernel.tiles if kernel else []) if t.core == core]
            found = sorted({b.offset: b for b in found}.values(), key=lambda b: b.offset)  # one per reused address
            self._layouts[key] = ([b.offset for b in found], found)
        return self._layouts[key]

    def code_address(self, node: int, core: int, pc: int) -> int:
        return self.config.code_base + (node << 28) + (core << 20) + 4 * pc

    def instruction_at(self, address: int) -> tuple[int, int, int] | None:
        rel = address - self.config.code_base
        node, rest = divmod(rel, 1 << 28)
        core, offset = divmod(rest, 1 << 20)
        if rel < 0 or node >= len(self.kernels) or core >= self.config.cores or offset % 4:
            return None
        if offset // 4 >= len(self.kernels[node].programs[core]):
            return None
        return node, core + 1, offset // 4

    def disassemble(self, node: int, unit: int) -> list[InstructionInfo]:
        """A core's stream; a DMA engine's is the transfers its core issues."""
        agent = unit - 1
        core = agent % self.config.cores
        dma = agent >= self.config.cores
        program = self.kernels[node].programs[core]
        return [InstructionInfo(self.code_address(node, core, pc), unit, pc, ins.text())
                for pc, ins in enumerate(program) if not dma or ins.op in ("dma.ld", "dma.st", "dma.gather")]

    def rewrite(self, node: int, prefix: list[int], edits: list[tuple[int, int, bytes]]) -> None:
        memory_edits = []
        for step, address, data in edits:
            space, core, offset = self.memories.resolve(address)
            memory_edits.append(MemoryEdit(step, space, core, offset, data))
        self.pending[node] = (np.array([u - 1 for u in prefix], np.int16), tuple(memory_edits))

    def edits(self, node: int) -> list[tuple[int, int, bytes]]:
        record = self.records.get(node)
        return [(e.step, self.memories.address(e.space, e.core, e.offset), e.data) for e in record.edits] \
            if record else []


_HOST = torch.device("cpu")


def _bound(node: Node, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """Input value name -> the tensor bound to it, by walking the node's arguments beside the bound ones."""
    found: dict[str, torch.Tensor] = {}

    def walk(spec: Any, value: Any) -> None:
        if isinstance(spec, Ref):
            found[spec.name] = value
        elif isinstance(spec, (list, tuple)):
            for s, v in zip(spec, value):
                walk(s, v)
        elif isinstance(spec, dict):
            for key in spec:
                walk(spec[key], value[key])

    walk(node.args, args)
    walk(node.kwargs, kwargs)
    return found


def _write(buf, tensor: torch.Tensor) -> None:
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    if raw.size != buf.nbytes:
        raise DriverError(f"'{buf.label}' holds {buf.nbytes} bytes of {buf.dtype}; got a tensor of {raw.size} bytes "
                          f"({tensor.dtype}, {tuple(tensor.shape)})")
    buf.flat.view(np.uint8)[:] = raw


def _overlay(out: np.ndarray, offset: int, data: np.ndarray, data_offset: int) -> None:
    """Copy the part of `data` (at data_offset) that overlaps out's range (at offset)."""
    lo, hi = max(offset, data_offset), min(offset + len(out), data_offset + len(data))
    if lo < hi:
        out[lo - offset:hi - offset] = data[lo - data_offset:hi - data_offset]
