"""A kernel tensor's elements by name, and what the launch's recorded accesses did to them up to a step.

A tensor is named by its parameter (`out_ptr`) or its Program value (`out_ptr_after`), one element of it by its
flat index (`out_ptr[37]`): the spelling data breakpoints and `locate` share. `locate` of an element is its address
in `global`, the last write and the last read before the position and every write; of a whole tensor, which
programs wrote which element ranges. Nothing runs again: the answer is read off the first run's Access records
(run.py), which are the run at every position (a replay is that run, bit for bit).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import torch

from hardware.drivers.triton.launch import KernelLaunch
from hardware.drivers.triton.memory import KernelMemory, KernelTensor
from hardware.drivers.triton.run import Access
from hardware.errors import DriverError, echo

MAX_WRITES = 64  # an element's writes listed (the first ones, oldest first; the last one is `lastWrite` anyway)
MAX_WRITERS = 64  # a tensor's programs listed (in grid order)
MAX_RANGES = 16  # element ranges listed per program
_INDEX = re.compile(r"-?[0-9]+")  # ASCII digits only: int() would take other scripts' digits too


@dataclass(frozen=True)
class Watched:
    """A tensor of the launch (its index in the launch's memory), or one element of it (a flat index)."""

    tensor: int
    element: int | None
    name: str  # the tensor's name as given: a parameter, or a Program value of it


def watched(memory: KernelMemory, text: str, after: str) -> Watched | None:
    """What `text` names: None when it names no tensor of the launch and gives no index (it is some other name);
    a DriverError in words when its index names no element, or when an index follows a name no tensor has."""
    name, bracket, rest = str(text).partition("[")
    name = name.strip()
    params = [t.param for t in memory.tensors]
    param = name.removesuffix(after)
    if param not in params:
        if bracket:
            raise DriverError(f"'{echo(name)}' is not a tensor of the kernel: its tensors are {', '.join(params)}")
        return None
    t = params.index(param)
    if not bracket:
        return Watched(t, None, name)
    index, closed, tail = rest.partition("]")
    index = index.strip()
    count = memory.tensors[t].tensor.numel()
    span = f"{param} has {count} element(s), flat indices 0..{count - 1}"
    if not closed or tail.strip() or not _INDEX.fullmatch(index):
        raise DriverError(f"'{echo(text)}' names no element: an element of a kernel tensor is its flat index, a "
                          f"whole number ({param}[0]; {span})")
    # (int() refuses thousands of digits: a number that long is past the end, or before the start)
    element = int(index) if len(index) <= 20 else (-1 if index.startswith("-") else count)
    if element < 0:
        raise DriverError(f"'{echo(text)}' names no element: a flat index counts from 0, not back from the end "
                          f"({span})")
    if element >= count:
        raise DriverError(f"'{echo(text)}' names no element: {span}")
    return Watched(t, element, name)


def number(tensor: KernelTensor, raw: Any) -> float | int | bool:
    """An element's value as recorded (bfloat16 is recorded as its raw 16-bit word) as a Python number."""
    if tensor.tensor.dtype == torch.bfloat16:
        return float(np.array([int(raw) << 16], np.uint32).view(np.float32)[0])
    return np.asarray(raw).item()


def shown(value: float | int | bool) -> str:
    """A value in a sentence: `0.52`, `-3`, `True`."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def element_story(launch: KernelLaunch, memory: KernelMemory, accesses: Iterable[Access], w: Watched, steps: int,
                  total: int) -> dict:
    """An element after `steps` steps of the launch (of `total`): its place, the last write and read, every write."""
    t = memory.tensors[w.tensor]
    said = f"{t.param}[{w.element}]"
    writes, last_read = [], None
    for acc in accesses:
        if acc.step >= steps:
            break
        if acc.tensor != w.tensor:
            continue
        hit = np.flatnonzero(acc.elements == w.element)
        if not len(hit):
            continue
        seen = _access(launch, t, acc, int(hit[-1]))
        if acc.kind == "load":
            last_read = seen
        else:
            writes.append(seen)
            if acc.kind == "atomic":  # an atomic reads the element too
                last_read = seen
    out = {**_place(t, steps, total, w.element), "element": w.element,
           "index": [int(i) for i in np.unravel_index(w.element, tuple(t.tensor.shape))] if t.tensor.dim() else [],
           "lastWrite": writes[-1] if writes else None, "lastRead": last_read,
           "writes": writes[:MAX_WRITES], "totalWrites": len(writes)}
    run = _steps_run(steps, total)
    if not writes:
        out["lastWriteReason"] = f"no program has written {said} {run}"
    if last_read is None:
        out["lastReadReason"] = f"no program has read {said} {run}"
    if len(writes) > MAX_WRITES:
        out["truncated"] = f"the first {MAX_WRITES} of {len(writes)} writes"
    return out


def tensor_story(launch: KernelLaunch, memory: KernelMemory, accesses: Iterable[Access], w: Watched, steps: int,
                 total: int) -> dict:
    """A whole tensor after `steps` steps of the launch: which programs wrote which element ranges."""
    t = memory.tensors[w.tensor]
    by_unit: dict[int, list[Access]] = {}
    for acc in accesses:
        if acc.step >= steps:
            break
        if acc.tensor == w.tensor and acc.kind != "load" and len(acc.elements):
            by_unit.setdefault(acc.unit, []).append(acc)
    written = np.zeros(t.tensor.numel(), bool)
    writers = []
    for unit in sorted(by_unit):
        mine = by_unit[unit]
        elements = np.unique(np.concatenate([a.elements for a in mine]))
        written[elements] = True
        ranges = _ranges(elements)
        writers.append({"thread": launch.program_name(unit), "program": list(launch.program_index(unit)),
                        "ranges": ranges[:MAX_RANGES], "totalRanges": len(ranges), "elements": len(elements),
                        "stores": len(mine), "lines": sorted({a.line for a in mine}),
                        "atomic": any(a.kind == "atomic" for a in mine)})
    out = {**_place(t, steps, total), "elements": t.tensor.numel(), "written": int(written.sum()),
           "writers": writers[:MAX_WRITERS], "totalWriters": len(writers)}
    if not writers:
        out["writersReason"] = f"no program has written {t.param} {_steps_run(steps, total)}"
    if len(writers) > MAX_WRITERS:
        out["truncated"] = f"the first {MAX_WRITERS} of {len(writers)} programs that wrote {t.param}"
    return out


def _place(t: KernelTensor, steps: int, total: int, element: int | None = None) -> dict:
    """The tensor's (or its element's) place in `global`, and the position: steps of the launch run, of all."""
    address, nbytes = (t.address, t.nbytes) if element is None else (t.address + element * t.itemsize, t.itemsize)
    return {"tensor": t.param, "dtype": str(t.tensor.dtype).removeprefix("torch."), "shape": list(t.tensor.shape),
            "space": "global", "address": address, "nbytes": nbytes, "steps": steps, "launchSteps": total}


def _steps_run(steps: int, total: int) -> str:
    if steps == 0:
        return "yet: the launch has not begun"
    return "in the whole launch" if steps >= total else f"in the {steps} step(s) of the launch run so far"


def _access(launch: KernelLaunch, t: KernelTensor, acc: Access, lane: int) -> dict:
    return {"thread": launch.program_name(acc.unit), "program": list(launch.program_index(acc.unit)),
            "line": acc.line, "step": acc.step, "kind": acc.kind, "atomic": acc.kind == "atomic",
            "value": number(t, acc.values[lane])}


def _ranges(elements: np.ndarray) -> list[list[int]]:
    """Sorted distinct element offsets as [start, stop) runs: [0, 1, 2, 5] -> [[0, 3], [5, 6]]."""
    if not len(elements):
        return []
    breaks = np.flatnonzero(np.diff(elements) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(elements)]])
    return [[int(elements[a]), int(elements[b - 1]) + 1] for a, b in zip(starts, stops)]
