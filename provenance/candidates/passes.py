"""A side's pass, run by the engine, and the judgement of a candidate's value against the truth.

The truth is the reference's Program on the float64 driver (provenance/reference.py): a candidate is judged by
how far it is from what the reference computes exactly, at the tolerance of its own dtype, widened to what the
reference itself misses by at that dtype (a float16 candidate is not asked to be better than the float16
reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from checkpoint.timeline import Timeline
from hardware.driver import to_host
from hardware.drivers import open_driver
from hardware.errors import DriverError, RewindError
from hardware.program import Program
from provenance.compare import DEFAULT_TOLERANCES, Comparison, compare
from provenance.reference import DEFAULT_REFERENCE, Reference, open_reference

BUDGET = 256 << 20  # checkpoint bytes per pass: the functions compared are small


class Pass:
    """A Program run to its end on a driver; values by name as host tensors."""

    def __init__(self, program: Program, driver: str = "torch:cpu"):
        try:
            self.driver = open_driver(driver)
        except DriverError as exc:
            raise RewindError(f"driver '{driver}': {exc}") from None
        self.program = program
        self.labels: dict[str, str] = {}  # an input's value -> the user's name of it (a function's parameter)
        self.timeline = Timeline(program, self.driver, BUDGET)
        self.timeline.seek(self.timeline.end)

    def value(self, name: str) -> torch.Tensor:
        info = self.program.values[name]
        position = 0 if info.producer is None else self.timeline.end
        return to_host(self.driver, self.timeline.value(name, position))

    def label(self, name: str) -> str:
        return self.labels.get(name, name)

    def outputs(self) -> list[torch.Tensor]:
        return [self.value(n) for n in self.program.outputs]

    def rerun(self, start: int, given: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The nodes from index `start` on run again by the engine with the values in `given` in place of the
        pass's own (recomputation from the pass's state): every value they write, by name."""
        out: dict[str, torch.Tensor] = {}

        def value_of(name: str) -> Any:
            if name in out:
                return out[name]
            if name in given:
                return given[name]
            return self.value(name)

        for node in self.program.nodes[start:]:
            for name, tensor in zip(node.outputs, self.timeline.run_node(node, value_of)):
                out[name] = to_host(self.driver, tensor)
        return out


def truth(program: Program) -> Reference:
    """The reference's Program at float64: the same engine on the float64 driver."""
    return open_reference(DEFAULT_REFERENCE, program, BUDGET)


@dataclass
class Judged:
    comparison: Comparison
    wrong: torch.Tensor  # bool, the value's shape: elements beyond tolerance


def judge(name: str, test: torch.Tensor, exact: torch.Tensor, slack: float = 1.0) -> Judged:
    """`test` against the exact value, at the tolerance of `test`'s dtype times `slack`."""
    dtype = str(test.dtype).removeprefix("torch.")
    rtol, atol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
    rtol, atol = rtol * slack, atol * slack
    comparison = compare(name, dtype, test, exact, rtol, atol)
    return Judged(comparison, wrong_elements(test, exact, rtol, atol))


def wrong_elements(test: torch.Tensor, exact: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """The elements `compare` counts as mismatches, as a mask (NaN matches NaN, an infinity the same infinity)."""
    a, b = test.detach().double(), exact.detach().double()
    if a.shape != b.shape:
        return torch.ones(a.shape, dtype=torch.bool)
    finite = b[torch.isfinite(b)]
    scale = float(finite.square().mean().sqrt()) if finite.numel() else 0.0
    agree = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(agree, 0.0, (a - b).abs().nan_to_num(nan=float("inf"), posinf=float("inf")))
    bound = atol + rtol * torch.maximum(b.abs().nan_to_num(nan=0.0, posinf=0.0), torch.tensor(scale))
    return (diff > bound) | torch.isinf(diff)
