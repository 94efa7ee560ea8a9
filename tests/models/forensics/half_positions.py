"""Planted bug (no NaN anywhere): rotary-style angles from positions counted in float16.

float16 holds every integer only up to 2048: beyond it `arange` rounds positions to even
numbers (to multiples of 4 beyond 4096). Each position is within float16's relative tolerance,
but `cos` and `sin` see the angle's absolute error, up to a radian: the first node beyond
tolerance is the `cos`, which computes exactly what it is given. The root cause is the arange.
"""

import torch
from torch import nn


class Rotary(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (100.0 ** (torch.arange(0, width, 2).float() / width)))

    def forward(self, x):
        pos = torch.arange(x.shape[0], dtype=torch.float16)  # BUG: float16 positions beyond 2048
        angles = pos[:, None].float() * self.inv_freq
        turned = x * torch.cos(angles) + x.flip(-1) * torch.sin(angles)  # AMPLIFIED
        return turned.sum(-1)


def build():
    torch.manual_seed(5)
    return Rotary(), (torch.randn(3000, 2),)
