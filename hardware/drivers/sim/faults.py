"""Fault injection: the compiler bugs parallel programs die of, planted in one node's kernel.

    {"kind": "drop_barrier", "node": "softmax", "unit": "core 3"}      core 3 skips the barrier; the others
                                                                        no longer wait for it (a race)
    {"kind": "miscount_barrier", "node": "softmax", "by": 1}           the barrier waits for one unit too many
                                                                        (a hang)
    {"kind": "skip_dma_wait", "node": "linear", "unit": "core 0"}      core 0 computes before its load lands
    {"kind": "drop_signal", "node": "linear_3", "unit": "core 8"}      a semaphore nobody signals (a hang)

`nth` (default 0) picks which of the unit's barriers, DMA waits or signals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from hardware.drivers.sim.chip import ChipConfig
from hardware.drivers.sim.kernel import Kernel
from hardware.errors import DriverError
from hardware.program import Program

KINDS = {"drop_barrier": "bar", "miscount_barrier": "bar", "skip_dma_wait": "dma.wait", "drop_signal": "sig"}
_KEYS = {"kind", "node", "unit", "nth", "by"}
_CORE = re.compile(r"^\s*core\s+(\d+)\b")


@dataclass(frozen=True)
class Fault:
    kind: str
    node: str | int
    unit: int | None  # a core
    nth: int = 0
    by: int = 1

    def __str__(self) -> str:
        who = f" on core {self.unit}" if self.unit is not None else ""
        return f"{self.kind} in node {self.node!r}{who}"


def parse_faults(specs: Iterable[Mapping[str, Any]] | None, config: ChipConfig) -> list[Fault]:
    out = []
    for i, spec in enumerate(specs or ()):
        where = f"fault {i}"
        if not isinstance(spec, Mapping):
            raise DriverError(f"{where}: expected an object like {{\"kind\": \"drop_barrier\", \"node\": ...}}")
        unknown = set(spec) - _KEYS
        if unknown:
            raise DriverError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_KEYS))})")
        kind = spec.get("kind")
        if kind not in KINDS:
            raise DriverError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if "node" not in spec:
            raise DriverError(f"{where}: 'node' (a node name or index) is required")
        unit = _core(spec.get("unit"), config, where)
        if unit is None and kind != "miscount_barrier":
            raise DriverError(f"{where}: {kind} needs a 'unit' (a core, like \"core 3\")")
        nth, by = spec.get("nth", 0), spec.get("by", 1)
        if not isinstance(nth, int) or nth < 0 or not isinstance(by, int) or by == 0:
            raise DriverError(f"{where}: 'nth' must be an integer >= 0 and 'by' a non-zero integer")
        out.append(Fault(kind, spec["node"], unit, nth, by))
    return out


def _core(unit: Any, config: ChipConfig, where: str) -> int | None:
    if unit is None:
        return None
    m = _CORE.match(unit) if isinstance(unit, str) else None
    core = int(m[1]) if m else unit if isinstance(unit, int) and not isinstance(unit, bool) else None
    if core is None or not 0 <= core < config.cores:
        raise DriverError(f"{where}: unit {unit!r} is not a core of sim:{config.name} (core 0 .. core {config.cores - 1})")
    return core


def node_index(fault: Fault, program: Program) -> int:
    if isinstance(fault.node, int) and 0 <= fault.node < len(program.nodes):
        return fault.node
    for node in program.nodes:
        if node.name == fault.node:
            return node.index
    raise DriverError(f"fault {fault}: no node {fault.node!r} in the program")


def inject(fault: Fault, kernel: Kernel) -> None:
    """Plant the fault in the kernel's instruction streams (and barrier counts)."""
    op = KINDS[fault.kind]
    cores = [fault.unit] if fault.unit is not None else range(len(kernel.programs))
    found = [(c, pc) for c in cores for pc, ins in enumerate(kernel.programs[c]) if ins.op == op]
    if fault.unit is None:  # a barrier of the node: its nth distinct barrier
        ids = list(dict.fromkeys(kernel.programs[c][pc].tag for c, pc in found))
        target = ids[fault.nth] if fault.nth < len(ids) else None
        found = [(c, pc) for c, pc in found if kernel.programs[c][pc].tag == target]
    elif fault.nth < len(found):
        found = [found[fault.nth]]
    else:
        found = []
    if not found:
        what = {"bar": "barrier", "dma.wait": "DMA wait", "sig": "semaphore signal"}[op]
        raise DriverError(f"fault {fault}: the node's kernel has no {what} number {fault.nth} there")
    core, pc = found[0]
    ins = kernel.programs[core][pc]
    if fault.kind == "miscount_barrier":
        kernel.barriers[ins.tag] = max(1, kernel.barriers[ins.tag] + fault.by)
        return
    kernel.programs[core] = kernel.programs[core][:pc] + kernel.programs[core][pc + 1:]
    if fault.kind == "drop_barrier":
        kernel.barriers[ins.tag] -= 1
