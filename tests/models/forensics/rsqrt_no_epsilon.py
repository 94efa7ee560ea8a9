"""Planted bug: a float16 layer norm without an epsilon.

One row is nearly constant: its variance (about 1e-9) underflows float16 to zero, and the
reciprocal square root of zero is Inf. In float64 the variance is small but not zero.
"""

import torch
from torch import nn


class NormNoEps(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        centered = x - x.mean(-1, keepdim=True)
        variance = (centered * centered).mean(-1, keepdim=True)
        scale = torch.rsqrt(variance)  # BUG: no epsilon
        return self.proj(centered * scale)


def build():
    torch.manual_seed(1)
    x = torch.randn(4, 16)
    x[2] = 0.01 + 5e-5 * torch.randn(16)  # a nearly constant row
    return NormNoEps().half(), (x.half(),)
