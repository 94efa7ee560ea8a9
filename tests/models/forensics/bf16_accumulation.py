"""Planted bug (no NaN anywhere): a running sum accumulated in bfloat16.

Each step adds a small increment to a total near 8, where bfloat16's spacing is 0.0625:
the additions round away. No single step is badly wrong; together they lose most of the sum.
"""

import torch
from torch import nn


class RunningTotal(nn.Module):
    def __init__(self, steps: int = 48):
        super().__init__()
        self.steps = steps

    def forward(self, base, increments):
        total = base
        for t in range(self.steps):
            total = total + increments[:, t]  # BUG: accumulates in bfloat16
        return total


def build():
    torch.manual_seed(3)
    base = torch.full((4,), 8.0)
    increments = torch.rand(4, 48) * 0.02 + 0.005
    return RunningTotal().to(torch.bfloat16), (base.to(torch.bfloat16), increments.to(torch.bfloat16))
