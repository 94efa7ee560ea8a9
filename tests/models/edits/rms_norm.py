"""Planted bug for source edits: a float16 RMSNorm-like module without an epsilon.

One row of the input is all zeros (a padding position): its mean square is 0, the reciprocal
square root of 0 is Inf, and 0 * Inf is NaN. Edited copies live beside it (rms_norm_*.py).
"""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width) + 0.1 * torch.randn(width))

    def forward(self, x):
        scale = torch.rsqrt((x * x).mean(-1, keepdim=True))  # BUG: no epsilon
        return x * scale * self.weight


class Block(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.norm = RMSNorm(width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return self.proj(self.norm(x))


def build():
    torch.manual_seed(11)
    x = torch.randn(4, 16)
    x[1] = 0.0  # a padding row
    return Block().half(), (x.half(),)
