"""Full coverage for a candidate function or kernel: both sides run on a generated suite and every case is judged.

The suite is generated from the example arguments and the candidate's own structure:
- sizes: each group of input dimensions that share a size (the keys and values of attention) is set to 1, the
  block, the block + 1 and a size with a tail (two blocks and a half), the block being the length of the slices
  the candidate's loop reads along it; a dimension no loop reads by block is set to 1 and to its size + 1;
- dtypes: float64, float16, bfloat16 (the example's float32 is the base case);
- scales: every floating input times 0.125, 0.25, 0.5, 2, 4, 8;
- special values: zeros, large negatives (minus 1000), a NaN and an infinity in the first element of the last
  input: where the reference has NaN/Inf the candidate must have the same, elsewhere its values.
Each case is judged as `compare` judges the example (the candidate at its dtype against the reference at
float64, with the reference's own error at that dtype allowed); the candidate passes only when every case does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from hardware.errors import RewindError
from hardware.program import Program
from provenance.candidates.loops import find_loop
from provenance.candidates.passes import Pass, judge, truth

SCALES = (0.125, 0.25, 0.5, 2.0, 4.0, 8.0)
DTYPES = (torch.float64, torch.float16, torch.bfloat16)


@dataclass
class Case:
    name: str
    args: tuple


def suite(example: tuple, candidate: Program, names: list[str]) -> list[Case]:
    """`names`: the function's parameters, to say which dimensions a case sizes (`k dim 0`)."""
    cases = [Case("example", example)]
    for dims, sizes in _size_groups(example, candidate):
        for size in sizes:
            cases.append(Case(f"size {size} for {_dims_text(dims, names)}", _resized(example, dims, size)))
    for dtype in DTYPES:
        cases.append(Case(f"dtype {str(dtype).removeprefix('torch.')}", _floats(example, lambda t: t.to(dtype))))
    for scale in SCALES:
        cases.append(Case(f"scale x{scale:g}", _floats(example, lambda t: t * scale)))
    cases.append(Case("zeros", _floats(example, torch.zeros_like)))
    cases.append(Case("large negatives", _floats(example, lambda t: t - 1000.0)))
    for name, special in (("NaN", float("nan")), ("infinity", float("inf"))):
        cases.append(Case(f"{name} in the last input", _special(example, special)))
    return cases


def _size_groups(example: tuple, candidate: Program) -> list[tuple[list[tuple[int, int]], list[int]]]:
    inputs = [n for n, v in candidate.values.items() if v.kind == "input"]
    loop = find_loop(candidate)
    blocks: dict[tuple[int, int], int] = {}
    for reads in (loop.reads if loop else []):
        for r in reads:
            key = (inputs.index(r.input), r.dim)
            blocks[key] = max(blocks.get(key, 0), r.end - r.start)
    groups: dict[int, list[tuple[int, int]]] = {}
    for k, t in enumerate(example):
        if isinstance(t, torch.Tensor):
            for d, size in enumerate(t.shape):
                groups.setdefault(size, []).append((k, d))
    out = []
    for size, dims in groups.items():
        block = max((blocks.get(d, 0) for d in dims), default=0)
        sizes = [1, block, block + 1, 2 * block + block // 2] if block else [1, size + 1]
        out.append((dims, list(dict.fromkeys(s for s in sizes if s >= 1))))
    return out


def _dims_text(dims: list[tuple[int, int]], names: list[str]) -> str:
    return ", ".join(f"{names[k] if k < len(names) else f'input {k + 1}'} dim {d}" for k, d in dims)


def _resized(example: tuple, dims: list[tuple[int, int]], size: int) -> tuple:
    g = torch.Generator().manual_seed(size)
    out = []
    for k, t in enumerate(example):
        if not isinstance(t, torch.Tensor):
            out.append(t)
            continue
        shape = [size if (k, d) in dims else s for d, s in enumerate(t.shape)]
        out.append(torch.randn(shape, generator=g).to(t.dtype) if t.is_floating_point() else
                   torch.zeros(shape, dtype=t.dtype))
    return tuple(out)


def _floats(example: tuple, change: Callable[[torch.Tensor], torch.Tensor]) -> tuple:
    return tuple(change(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in example)


def _special(example: tuple, value: float) -> tuple:
    out = list(example)
    last = max(k for k, t in enumerate(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
    out[last] = out[last].clone()
    out[last].view(-1)[0] = value
    return tuple(out)


def run_case(case: Case, export_candidate, export_reference, driver: str) -> dict:
    """One case: the candidate's outputs against the reference's at float64, each with its error."""
    try:
        candidate = export_candidate(case.args)
        reference = export_reference(case.args)
    except RewindError as exc:
        return {"case": case.name, "passed": False, "reason": f"it could not run: {exc}"}
    mine, theirs = Pass(candidate, driver), Pass(reference, driver)
    exact = truth(reference)
    worst, reasons = 0.0, []
    for a, b in zip(candidate.outputs, reference.outputs):
        x, y = mine.value(a), theirs.value(b)
        if (x.shape, x.dtype) != (y.shape, y.dtype):
            reasons.append(f"output '{a}' is {_typed(x)} where the reference's is {_typed(y)}")
            continue
        own = judge(b, y, exact.value(b)).comparison.error
        slack = max(1.0, 2.0 * own) if own == own and own != float("inf") else 1.0
        judged = judge(a, x, exact.value(b), slack)
        worst = max(worst, judged.comparison.error)
        if not judged.comparison.within:
            first = judged.comparison.first_mismatch
            reasons.append(f"output '{a}' has {judged.comparison.mismatches} of {x.numel()} elements beyond "
                           f"tolerance (error {judged.comparison.error:.3g} x tolerance, first at {list(first or [])})")
    return {"case": case.name, "passed": not reasons, "error": worst,
            "reason": "; ".join(reasons) if reasons else "within tolerance"}


def _typed(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def exported_once(export: Callable[[tuple], Program]) -> Callable[[tuple], Program]:
    """`export`, run once per set of shapes and dtypes: arguments that differ only in their values (a scale, a NaN)
    run the Program exported for the first of them over the new values."""
    programs: dict[tuple, Program] = {}

    def program_for(args: tuple) -> Program:
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else repr(a) for a in args)
        if key not in programs:
            programs[key] = export(args)
            return programs[key]
        program = programs[key]
        inputs = [n for n, v in program.values.items() if v.kind == "input"]
        return program.with_inputs(dict(zip(inputs, [a for a in args if isinstance(a, torch.Tensor)])))

    return program_for


def validate(example: tuple, export_candidate, export_reference, names: list[str], driver: str = "torch:cpu") -> dict:
    started = time.monotonic()
    export_candidate, export_reference = exported_once(export_candidate), exported_once(export_reference)
    cases = suite(example, export_candidate(example), names)
    results = [run_case(c, export_candidate, export_reference, driver) for c in cases]
    failed = [r for r in results if not r["passed"]]
    return {"verdict": "validated" if not failed else "rejected", "cases": results, "failed": len(failed),
            "reason": f"every one of the {len(results)} cases is within tolerance of the reference" if not failed
            else f"{len(failed)} of {len(results)} cases fail, the first: {failed[0]['case']}: {failed[0]['reason']}",
            "seconds": time.monotonic() - started}
