"""Planted bug: attention where one query may see no key, so its softmax row is all -Inf.

softmax of a row with every element masked is 0/0 = NaN in any precision.
"""

import torch
from torch import nn


class PaddedAttention(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.qk = nn.Linear(width, width)

    def forward(self, x, allowed):
        h = self.qk(x)
        scores = h @ h.transpose(-2, -1)
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # BUG: a row with no allowed key
        return weights @ x


def build():
    torch.manual_seed(6)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    allowed[3] = False  # a padding query that may attend to nothing
    return PaddedAttention(), (torch.randn(5, 8), allowed)
