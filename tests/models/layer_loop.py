"""Loops over layers as people write them: four nn.Linear in an nn.ModuleList, one line in the loop's body; the
same module applied twice in a loop; and, outside any loop, one line calling two nn.Linear (one execution)."""

import torch
from torch import nn


class Layers(nn.Module):
    def __init__(self, width: int = 8, depth: int = 4):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.mix = nn.Linear(width, width)
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        x = x * self.scale
        for layer in self.layers:
            x = torch.relu(layer(x))
        for _ in range(2):
            x = self.mix(x)
        x = self.b(self.a(x))
        return x.sum(dim=-1)


def build():
    torch.manual_seed(3)
    return Layers(), (torch.randn(2, 8),)
