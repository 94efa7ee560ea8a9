"""What the triton driver tells about its launch: the Schedule with its findings, and the launch inside it (each
program's next operation, its kernel's local values, the tensors' bytes) after some steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hardware.drivers.triton.memory import KernelMemory
from hardware.drivers.triton.run import Finding, ProgramRun
from hardware.instructions import ChipState, NodeSchedule, RaceReport, StepFinding, UnitState
from hardware.memory import Location

FILTER = {"out of bounds": "access", "padding reaches output": "access", "unwritten read": "access"}


def schedule_of(run: ProgramRun) -> NodeSchedule:
    log = run.log
    units, pcs = np.asarray(log.units, np.int32), np.asarray(log.pcs, np.int32)
    races, others = [], []
    for f in log.findings:
        if f.kind == "race":
            races.append(_race(run, f, pcs))
        else:
            others.append(StepFinding(FILTER[f.kind], f.step, f.unit, f.message, finding_detail(run, f)))
    return NodeSchedule(units, pcs, races, None, others)


def finding_detail(run: ProgramRun, f: Finding) -> dict:
    out = {"kind": f.kind, "program": run.launch.program_name(f.unit), "line": f.line, "tensor": f.tensor,
           "elements": list(f.elements)}
    if f.other is not None:
        out["first"] = {"program": run.launch.program_name(f.other[0]), "line": f.other[2]}
    return out


def _race(run: ProgramRun, f: Finding, pcs: np.ndarray) -> RaceReport:
    first_unit, first_step, _ = f.other
    t = next(i for i, k in enumerate(run.memory.tensors) if k.param == f.tensor)
    tensor = run.memory.tensors[t]
    element = f.elements[0]
    return RaceReport(first_unit, first_step, int(pcs[first_step]), f.unit, f.step, int(pcs[f.step]), f.race,
                      "global", tensor.address + element * tensor.itemsize, tensor.itemsize,
                      f"{f.tensor}[{element}]")


class KernelChipState(ChipState):
    """The launch after `step` steps: a run parked there (its program threads wait at their next operation)."""

    def __init__(self, memory: KernelMemory, run: ProgramRun):
        self.memory, self.run = memory, run
        self.step = run.steps

    def units(self) -> list[UnitState]:
        run, ops = self.run, self.run.log.ops
        out = []
        for unit in range(1, run.launch.programs + 1):
            mine = ops.get(unit, [])
            if run.finished[unit]:
                out.append(UnitState(unit, None, "halted", "finished"))
                continue
            pc = run.pc[unit] if run.started[unit] else 0
            detail = f"line {mine[pc].line}: {mine[pc].text}" if pc < len(mine) else "not started"
            out.append(UnitState(unit, pc, "ready", detail))
        return out

    def read(self, address: int, count: int) -> bytes:
        t, offset = self.memory.by_address(address)
        raw = self.memory.tensors[t].tensor.view(-1).view(torch.uint8).numpy()
        return raw[offset:offset + count].tobytes()

    def touches(self, address: int) -> bool:
        return self.memory.by_address(address) is not None

    def placement(self, value: str) -> list[Location]:
        return []

    def locals(self, unit: int) -> dict[str, Any]:
        """The kernel's local values in `unit`'s frame at its next operation, as tensors (blocks and scalars)."""
        frame = self.run.frames.get(unit)
        if frame is None:
            return {}
        out = {}
        for name, value in frame.f_locals.items():
            data = getattr(getattr(value, "handle", None), "data", None)
            if isinstance(data, np.ndarray) and data.dtype.kind in "biuf":
                shape = getattr(getattr(value, "type", None), "shape", None)
                out[name] = torch.from_numpy(data.copy()).reshape(tuple(int(s) for s in shape) if shape else ())
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[name] = value
        return out
