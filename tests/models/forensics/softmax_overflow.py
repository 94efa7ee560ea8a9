"""Planted bug: softmax written by hand in float16 without subtracting the row max.

exp() of a score above ~11.1 overflows float16 (largest 65504), and Inf / Inf is NaN.
"""

import torch
from torch import nn


class NaiveAttention(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width)

    def forward(self, x):
        scores = self.query(x) @ self.key(x).transpose(-2, -1)
        weights = torch.exp(scores)  # BUG: no max subtraction
        weights = weights / weights.sum(-1, keepdim=True)
        return weights @ x


def build():
    torch.manual_seed(0)
    return NaiveAttention().half(), ((torch.randn(1, 8, 16) * 2.5).half(),)
