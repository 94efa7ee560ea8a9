"""A small self-attention block: the original the refactor and its fix are compared with."""

import torch
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        weights = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1)
        mixed = weights @ v
        return self.out(mixed)


def build():
    torch.manual_seed(0)
    return SelfAttention(), (torch.randn(2, 12, 16),)
