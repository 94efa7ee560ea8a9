"""The simulated chips: their units, memories and global physical address map (docs/sim.md).

A chip is gangs of cores. Every core has banked on-chip memory (SRAM, or a mobile NPU's
tightly coupled memory) and one DMA engine; all cores share DRAM. Each core and each DMA
engine is a Unit: the scheduler interleaves their steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hardware.driver import Chip, MemorySpace, Unit
from hardware.errors import DriverError


@dataclass(frozen=True)
class ChipConfig:
    name: str
    gangs: int
    cores_per_gang: int
    local_name: str  # the on-chip memory's name: "SRAM", "TCM"
    local_base: int  # physical address of core 0's local memory
    local_stride: int  # address distance between consecutive cores' local memories
    banks: int
    bank_bytes: int
    dram_base: int
    dram_bytes: int  # size of the DRAM window in the address map
    code_base: int  # instruction memory: where each node's per-core programs are loaded

    @property
    def cores(self) -> int:
        return self.gangs * self.cores_per_gang

    @property
    def local_bytes(self) -> int:
        return self.banks * self.bank_bytes

    @property
    def agents(self) -> int:
        """Scheduled units: cores 0..n-1, then their DMA engines n..2n-1."""
        return 2 * self.cores

    def gang_of(self, core: int) -> int:
        return core // self.cores_per_gang

    def agent_name(self, agent: int) -> str:
        core = agent % self.cores
        kind = "core" if agent < self.cores else "dma"
        return f"{kind} {core} (gang {self.gang_of(core)})"

    def local_address(self, core: int, offset: int) -> int:
        return self.local_base + core * self.local_stride + offset

    def bank_of(self, offset: int) -> int:
        return offset // self.bank_bytes

    def describe(self) -> Chip:
        """Unit 0 is the host that launches one node per tick; unit 1 + a is scheduled agent a."""
        units = [Unit(0, "host")]
        units += [Unit(1 + a, self.agent_name(a), self.gang_of(a % self.cores)) for a in range(self.agents)]
        spaces = [MemorySpace("DRAM", self.dram_base, self.dram_bytes)]
        spaces += [MemorySpace(f"{self.local_name} core {c}", self.local_address(c, 0), self.local_bytes)
                   for c in range(self.cores)]
        return Chip(f"sim:{self.name}", tuple(units), tuple(spaces))


# 4 chiplets x 8 cores, 4 x 128 KiB SRAM banks per core, 8 GiB DRAM window.
DEFAULT = ChipConfig("default", gangs=4, cores_per_gang=8, local_name="SRAM", local_base=0x1000_0000,
                     local_stride=0x10_0000, banks=4, bank_bytes=128 * 1024, dram_base=0x8000_0000,
                     dram_bytes=8 * 2**30, code_base=0x100_0000_0000)
# A mobile NPU: one cluster of 4 cores, each with 2 x 64 KiB tightly coupled memory.
NPU = ChipConfig("npu", gangs=1, cores_per_gang=4, local_name="TCM", local_base=0x0200_0000,
                 local_stride=0x4_0000, banks=2, bank_bytes=64 * 1024, dram_base=0x4000_0000,
                 dram_bytes=2 * 2**30, code_base=0x10_0000_0000)
CONFIGS = {c.name: c for c in (DEFAULT, NPU)}


def config_from_spec(spec: str) -> ChipConfig:
    """`sim` or `sim:<config>`."""
    _, _, name = spec.partition(":")
    config = CONFIGS.get(name or "default")
    if config is None:
        raise DriverError(f"unknown sim chip '{name}' in driver '{spec}' (known: {', '.join(sorted(CONFIGS))})")
    return config


class Memories:
    """The bytes of a chip: one DRAM array (as large as the memory plan needs) and each core's local memory."""

    def __init__(self, config: ChipConfig, dram_used: int):
        if dram_used > config.dram_bytes:
            raise DriverError(f"the program needs {dram_used} bytes of DRAM; sim:{config.name} has {config.dram_bytes}")
        self.config = config
        self.dram = np.zeros(dram_used, dtype=np.uint8)
        self.local = np.zeros((config.cores, config.local_bytes), dtype=np.uint8)

    def backing(self, space: str, core: int | None) -> np.ndarray:
        return self.dram if space == "DRAM" else self.local[core]

    def resolve(self, address: int) -> tuple[str, int | None, int] | None:
        """(space, core, offset) of a physical address, or None where no memory is mapped."""
        c = self.config
        if c.dram_base <= address < c.dram_base + len(self.dram):
            return "DRAM", None, address - c.dram_base
        core, offset = divmod(address - c.local_base, c.local_stride)
        if 0 <= core < c.cores and 0 <= offset < c.local_bytes and address >= c.local_base:
            return c.local_name, int(core), int(offset)
        return None

    def address(self, space: str, core: int | None, offset: int) -> int:
        c = self.config
        return c.dram_base + offset if space == "DRAM" else c.local_address(core, offset)
