"""Planted bug (no NaN anywhere): catastrophic cancellation in float32.

1 - cos(x) for small angles subtracts two nearly equal numbers: float32 keeps about seven
digits of cos(x) and loses most of them in the subtraction. Only a reference pass shows it.
"""

import torch
from torch import nn


class Curvature(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.out = nn.Linear(width, width)

    def forward(self, angle):
        bend = 1 - torch.cos(angle)  # BUG: cancellation; 2 * sin(angle / 2) ** 2 is exact
        return self.out(bend / (angle * angle))


def build():
    torch.manual_seed(2)
    return Curvature(), (torch.rand(4, 8) * 2e-3 + 1e-4,)
