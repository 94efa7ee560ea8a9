"""Input sets a fix is validated on: the example inputs, and more generated from them.

- seeds: new values with the example's statistics, row by row (each row along the last dimension
  keeps its mean and spread, so a nearly constant row stays nearly constant); integer inputs
  (token ids) drawn uniformly from the example's range; boolean inputs (masks) kept: they are
  the program's structure, not its data;
- value ranges: the example's floating inputs scaled down and up (within the dtype's range), far
  enough (x0.125 to x8) that a band-aid which only moves an underflow or overflow further out fails;
- shapes: a dimension size of the example inputs doubled wherever it occurs, the example's values
  tiled into it (a shape set varies the shape alone). torch.export exported the Program for the
  example's shapes, so another shape is exported again from the model file (its entry builds the
  same module), and kept only when the graph has the same nodes: patches name nodes. Each such
  set says it was re-exported.

Seeds and ranges need no export: they are other values for the same Program's inputs
(`Program.with_inputs`), run on a fresh Timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hardware.errors import RewindError
from hardware.frontends.torch_export import export_program, load_module
from hardware.program import Program

DEFAULT_SEEDS = 2
DEFAULT_SCALES = (0.125, 0.5, 2.0, 8.0)  # 8 is where float64 band-aids of float32 underflow
DEFAULT_SHAPES = 1
SHAPE_TRIES = 3  # exports tried at most for the shape sets


@dataclass
class InputSet:
    name: str  # "example", "seed 1", "range x2", "shape x[2, 8, 16]"
    kind: str  # "example", "seed", "range", "shape"
    program: Program  # the Program over these inputs (re-exported for another shape)
    note: str = ""

    def to_dict(self) -> dict:
        values = self.program.values
        inputs = {n: _describe(t) for n, t in self.program.initial.items() if values[n].kind == "input"}
        return {"name": self.name, "kind": self.kind, "inputs": inputs, "note": self.note}


@dataclass
class InputPlan:
    seeds: int = DEFAULT_SEEDS
    scales: tuple[float, ...] = DEFAULT_SCALES
    shapes: int = DEFAULT_SHAPES

    def __post_init__(self) -> None:
        if self.seeds < 0 or self.shapes < 0 or any(not s > 0 for s in self.scales):
            raise RewindError("input sets: seeds and shapes are counts >= 0, scales are numbers > 0")


def input_sets(program: Program, plan: InputPlan, model: str | None = None,
               entry: str = "build") -> tuple[list[InputSet], list[str]]:
    """The example, then the generated sets in a fixed order; and the sets that could not be made, with why."""
    example = _inputs(program)
    sets = [InputSet("example", "example", program)]
    for seed in range(1, plan.seeds + 1):
        gen = torch.Generator().manual_seed(seed)
        sets.append(InputSet(f"seed {seed}", "seed", program.with_inputs({n: resample(t, gen) for n, t in
                                                                          example.items()})))
    for scale in plan.scales:
        sets.append(InputSet(f"range x{scale:g}", "range", program.with_inputs({n: _scaled(t, scale) for n, t in
                                                                               example.items()})))
    skipped: list[str] = []
    if plan.shapes:
        if model is None or not Path(model).is_file():
            skipped.append("shapes: no model file to export again (a trace or a program given directly)")
        elif program.step_starts:
            skipped.append("shapes: a training step is not exported again for other shapes (its batches are the "
                           "file's own, batches())")
        else:
            found, why = _shape_sets(program, example, plan.shapes, model, entry)
            sets += found
            skipped += why
    return sets, skipped


def resample(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """New values like `t`'s: per row, its mean and spread (floating); its range (integers); itself (booleans)."""
    if t.dtype == torch.bool:
        return t.clone()
    if not t.is_floating_point():
        lo, hi = int(t.min()), int(t.max())
        return torch.randint(lo, hi + 1, t.shape, generator=gen, dtype=t.dtype)
    x = t.double()
    rows = x.reshape(-1, x.shape[-1]) if x.dim() and x.shape[-1] > 1 else x.reshape(1, -1)
    mean, std = rows.mean(-1, keepdim=True), rows.std(-1, keepdim=True).nan_to_num(0.0)
    fresh = mean + std * torch.randn(rows.shape, generator=gen, dtype=torch.float64)
    return _fit(fresh.reshape(t.shape), t.dtype)


def _scaled(t: torch.Tensor, scale: float) -> torch.Tensor:
    return _fit(t.double() * scale, t.dtype) if t.is_floating_point() else t.clone()


def _fit(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    big = torch.finfo(dtype).max
    return x.clamp(-big, big).to(dtype)


def _inputs(program: Program) -> dict[str, torch.Tensor]:
    return {n: t for n, t in program.initial.items() if program.values[n].kind == "input"}


def _shape_sets(program: Program, example: dict[str, torch.Tensor], wanted: int, model: str,
                entry: str) -> tuple[list[InputSet], list[str]]:
    """Double one dimension size at a time (every dimension of that size, in every input) and export again."""
    sizes = list(dict.fromkeys(s for t in example.values() for s in t.shape if s > 0))
    found: list[InputSet] = []
    skipped: list[str] = []
    for size in sizes[:SHAPE_TRIES]:
        if len(found) == wanted:
            break
        grown = {n: t.repeat(*[2 if s == size else 1 for s in t.shape]) for n, t in example.items()}
        shapes = ", ".join(f"{n}{list(t.shape)}" for n, t in grown.items())
        try:
            module, given = load_module(model, entry)
            # keyword inputs stay keywords (with what was fixed at export, a flag or a number, as given)
            inputs = ({k: grown.get(k, v) for k, v in given.items()} if isinstance(given, dict)
                      else tuple(grown.values()))
            other = export_program(module, inputs, program.name)
        except RewindError as exc:
            skipped.append(f"shapes {shapes}: the program does not export for them ({str(exc).splitlines()[0]})")
            continue
        if [(n.name, n.op) for n in other.nodes] != [(n.name, n.op) for n in program.nodes]:
            skipped.append(f"shapes {shapes}: the graph has other nodes at these shapes")
            continue
        found.append(InputSet(f"shape {shapes}", "shape", other,
                              f"re-exported from {Path(model).name} for these shapes (every dimension of size "
                              f"{size} doubled)"))
    return found, skipped


def _describe(t: torch.Tensor) -> dict:
    d = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    if t.numel() and t.dtype != torch.bool:
        x = t.double()
        d.update(min=float(x.min()), max=float(x.max()), mean=float(x.mean()))
    return d
