"""Planted bug: a float16 reduction whose total exceeds float16's largest number (65504).

The sum is both where an Inf is born and the first node beyond tolerance: one diagnosis for it.
"""

import torch
from torch import nn


class Total(nn.Module):
    def forward(self, x):
        return x.sum(-1)  # BUG: the total overflows float16


def build():
    torch.manual_seed(4)
    return Total(), ((torch.rand(2, 256) * 400 + 100).half(),)
