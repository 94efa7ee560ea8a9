"""How far a training run's losses drift from a float64 run that follows its own trajectory: a curve, not a finding.

Forensics compares each step with a reference started from the program's own state (provenance/reference.py's
per_step), so a finding is an error introduced in that step. Training is chaotic: over many steps float32 and
float64 runs part ways without any bug. This module measures that drift, the free-running reference's loss of each
step against the program's, for the report to show beside the findings.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from provenance.reference import Reference, open_reference

Loss = Callable[[str], torch.Tensor]


def trajectory(spec: str, program, budget: int, own: Loss, progress=None, collectives=None) -> list[dict]:
    """Each step's loss in this pass and in a free-running `spec` pass, with their difference relative to the
    loss (one step or a reference that is no driver's pass: no curve)."""
    if len(program.losses) < 2 or not spec.startswith("torch:"):
        return []
    free: Reference = open_reference(spec, program, budget, progress, collectives)
    points = []
    for step, name in enumerate(program.losses):
        mine, theirs = float(own(name).double().sum()), float(free.value(name).double().sum())
        points.append({"step": step, "loss": mine, "reference": theirs,
                       "difference": abs(mine - theirs) / abs(theirs) if theirs else (0.0 if mine == 0 else math.inf)})
    return points
