"""Max pooling undone by max_unpool2d: torch has no deterministic kernel for the unpooling (on the CPU too)."""

import torch
from torch import nn


class Unpool(nn.Module):
    def forward(self, x):
        pooled, where = nn.functional.max_pool2d(x, 2, return_indices=True)
        return nn.functional.max_unpool2d(pooled * 2.0, where, 2) + 1.0


def build():
    torch.manual_seed(0)
    return Unpool(), (torch.randn(1, 2, 4, 4),)
