"""A run long enough to pause: one wide layer applied many times (each tick is a large matmul)."""

import torch
from torch import nn


class Repeated(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.depth = depth

    def forward(self, x):
        for _ in range(self.depth):
            x = torch.tanh(x @ self.weight)
        return x


def build(width: int = 2048, depth: int = 40):
    torch.manual_seed(0)
    return Repeated(width, depth), (torch.randn(width, width),)
