"""Lower a whole Program for a sim chip: plan DRAM, lower every node, plant faults.

Every op the chip cannot run is named (with its nodes and source lines) in one error at launch.
"""

from __future__ import annotations

from hardware.drivers.sim import ops_matmul, ops_pointwise, ops_rows  # noqa: F401  (they register lowerings)
from hardware.drivers.sim.chip import ChipConfig
from hardware.drivers.sim.faults import Fault, inject, node_index
from hardware.drivers.sim.kernel import LOWERINGS, Kernel, KernelBuilder, MemoryPlan
from hardware.errors import UnsupportedOpError
from hardware.program import Program


def supported_ops() -> list[str]:
    return sorted(LOWERINGS)


def lower_program(config: ChipConfig, program: Program, faults: list[Fault]) -> tuple[MemoryPlan, list[Kernel]]:
    chip = f"sim:{config.name}"
    missing: dict[str, list[str]] = {}
    for node in program.nodes:
        if node.op not in LOWERINGS:
            missing.setdefault(node.op, []).append(f"'{node.name}'" + (f" at {node.loc}" if node.loc else ""))
    if missing:
        listed = "; ".join(f"{op} (node {', '.join(where)})" for op, where in sorted(missing.items()))
        raise UnsupportedOpError(f"the {chip} chip cannot run: {listed}")
    plan = MemoryPlan(config, program)
    kernels, errors = [], []
    for node in program.nodes:
        builder = KernelBuilder(config, plan, program, node)
        try:
            LOWERINGS[node.op](builder)
        except UnsupportedOpError as exc:
            errors.append(str(exc))
            continue
        kernels.append(builder.finish())
    if errors:
        raise UnsupportedOpError(f"the {chip} chip cannot run:\n" + "\n".join(errors))
    for fault in faults:
        inject(fault, kernels[node_index(fault, program)])
    return plan, kernels
