"""An MLP deep enough that a recording can be killed part way through (tests of interrupted traces)."""

import torch
from torch import nn


class Deep(nn.Module):
    def __init__(self, width: int = 64, depth: int = 60):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def build():
    torch.manual_seed(4)
    return Deep(), (torch.randn(4, 64),)
