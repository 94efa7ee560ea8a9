"""What the sim driver tells about a node: the chip inside it, its races and hang, where values' shards live."""

from __future__ import annotations

import numpy as np

from hardware.drivers.sim.chip import ChipConfig, Memories
from hardware.drivers.sim.isa import Buffer
from hardware.drivers.sim.kernel import Kernel, rows_cols, strides
from hardware.drivers.sim.machine import NodeRun
from hardware.instructions import ChipState, HangReport, RaceReport, UnitState, UnitWait
from hardware.memory import Location

MAX_RACES = 32  # per node: the first ones are the ones to fix


def race_reports(run: NodeRun, pcs: np.ndarray) -> list[RaceReport]:
    out, seen = [], set()
    for c in run.conflicts:
        key = (c.first_step, c.second_step)
        if key in seen:
            continue
        seen.add(key)
        start, stop = c.byte_range()
        buf = c.buffer
        tensor = buf.value if buf.space == "DRAM" and buf.label == buf.value else (
            f"{buf.label} (holding {buf.value})" if buf.value else buf.label)
        space = buf.space if buf.core is None else f"{buf.space} core {buf.core}"
        kind = f"{'write' if c.first_writes else 'read'}-{'write' if c.second_writes else 'read'}"
        out.append(RaceReport(c.first_unit + 1, c.first_step, int(pcs[c.first_step]), c.second_unit + 1,
                              c.second_step, int(pcs[c.second_step]), kind, space, start, stop - start, tensor))
        if len(out) == MAX_RACES:
            break
    return out


def hang_report(run: NodeRun) -> HangReport | None:
    if run.finished or run.runnable():
        return None
    waits = tuple(UnitWait(w.core + 1, f"{w.kind} {w.ident}", w.since, tuple(u + 1 for u in w.waiting_for), w.detail)
                  for w in run.waits())
    return HangReport(run.step_count, waits)


class SimChipState(ChipState):
    def __init__(self, config: ChipConfig, memories: Memories, chip: str, run: NodeRun):
        """`chip`: the driver's name, which the tiles' Locations carry."""
        self.config, self.memories, self.chip, self.run = config, memories, chip, run
        self.step = run.step_count
        kernel = run.kernel
        self._footprint = kernel.write_set() + [("DRAM", None, b.offset, b.offset + b.nbytes) for b in kernel.inputs]

    def units(self) -> list[UnitState]:
        run, cores = self.run, self.config.cores
        out = []
        for core in range(cores):
            program = run.kernel.programs[core]
            if run.halted[core]:
                out.append(UnitState(core + 1, None, "halted", "halted"))
                continue
            wait = run.wait_of(core)
            status, detail = ("blocked", wait.detail) if wait else ("ready", program[run.pc[core]].text())
            out.append(UnitState(core + 1, run.pc[core], status, detail))
        for engine in range(cores):
            queue = run.queues[engine]
            detail = f"{len(queue)} queued; next for pc {queue[0].pc}: {queue[0].ins.text()}" if queue else "idle"
            out.append(UnitState(cores + engine + 1, queue[0].pc if queue else None, "busy" if queue else "idle",
                                 detail))
        return out

    def read(self, address: int, count: int) -> bytes:
        space, core, offset = self.memories.resolve(address)
        return self.memories.backing(space, core)[offset:offset + count].tobytes()

    def touches(self, address: int) -> bool:
        where = self.memories.resolve(address)
        if where is None:
            return False
        space, core, offset = where
        return any((s == "DRAM") == (space == "DRAM") and c == core and lo <= offset < hi
                   for s, c, lo, hi in self._footprint)

    def placement(self, value: str) -> list[Location]:
        """Tiles written so far that hold elements of `value` (the latest tile at each local address)."""
        latest: dict[tuple[int, int], tuple[int, Buffer]] = {}
        for tile in self.run.kernel.tiles:
            step = self.run.races.last_write(tile)
            if tile.value == value and tile.elements and step is not None:
                key = (tile.core, tile.offset)
                if key not in latest or latest[key][0] < step:
                    latest[key] = (step, tile)
        config = self.config
        return [_tile_location(config, self.chip, tile) for _, tile in latest.values()]


def _tile_location(config: ChipConfig, chip: str, tile: Buffer) -> Location:
    return Location(chip, config.agent_name(tile.core), config.local_name, tile.address, tile.nbytes,
                    str(tile.dtype), tile.shape, strides(tile.shape), bank=config.bank_of(tile.offset),
                    elements=tile.elements)


def shards_of(config: ChipConfig, buf: Buffer, kernel: Kernel) -> tuple[Location, ...]:
    """Per core: the elements of `buf` its stores (DMA or atomic) write, as a box of the [rows, last dim] view."""
    written: dict[int, list[np.ndarray]] = {}
    for core, program in enumerate(kernel.programs):
        for ins in program:
            if ins.op in ("dma.st", "atom.add") and ins.dst.buffer is buf:
                written.setdefault(core, []).append(np.asarray(ins.dst.index))
    _, cols = rows_cols(buf.shape)
    out = []
    for core, parts in written.items():
        flat = np.concatenate(parts)
        rows, columns = np.divmod(flat, max(cols, 1))
        r0, r1, c0, c1 = int(rows.min()), int(rows.max()) + 1, int(columns.min()), int(columns.max()) + 1
        size = buf.dtype.itemsize
        first, last = int(flat.min()), int(flat.max())
        out.append(Location(f"sim:{config.name}", config.agent_name(core), "DRAM", buf.address + first * size,
                            (last - first + 1) * size, str(buf.dtype), (r1 - r0, c1 - c0), (cols, 1),
                            elements=((r0, r1), (c0, c1))))
    return tuple(sorted(out, key=lambda loc: loc.address))
