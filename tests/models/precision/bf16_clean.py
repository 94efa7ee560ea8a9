"""A correct model in bfloat16 throughout (`.to(torch.bfloat16)`): layer norm, GELU MLP, residual. Clean."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def build():
    torch.manual_seed(4)
    return Block().to(torch.bfloat16), (torch.randn(8, 32).to(torch.bfloat16),)
