"""Planted bugs for source edits, both in float16: a layer norm built without an epsilon, and a
vector length whose sum of squares overflows.

Row 1 is constant: its variance is 0, so the norm divides 0 by 0. The other rows are large (about 60),
so the sum of their squares (about 6e4 per 16 elements) passes float16's largest value, 65504.
"""

import torch
from torch import nn


class LengthNormed(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(width, eps=0.0)  # BUG: no epsilon
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        length = x.pow(2).sum(-1, keepdim=True).sqrt()  # BUG: the sum of squares overflows float16
        return self.proj(self.norm(x)) * (length / 256.0)


def build():
    torch.manual_seed(12)
    x = 60.0 + 20.0 * torch.randn(4, 16)
    x[1] = 0.5  # a constant row
    return LengthNormed().half(), (x.half(),)
