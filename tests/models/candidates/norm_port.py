"""The MLP ported. Planted: the norm's epsilon became 1e-3 (it was 1e-6), which matters for activations of size
0.01; norm_port_fixed.py is the fix."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-3):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        power = x.pow(2).mean(-1, keepdim=True)
        normed = x * torch.rsqrt(power + self.eps)
        return normed * self.weight


class Model(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.norm = RMSNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        h = self.norm(x)
        return self.down(torch.relu(self.up(h)))


def build():
    torch.manual_seed(0)
    return Model(), (0.01 * torch.randn(4, 16),)
