"""Planted bug: log(softmax(x)) in float32, where widely spread scores underflow the softmax to 0.

log(0) = -Inf in the output; torch.log_softmax computes the same quantity without ever taking it.
"""

import torch
from torch import nn


class LogProbabilities(nn.Module):
    def forward(self, scores):
        return torch.log(torch.softmax(scores, dim=-1))  # BUG: log of an underflowed softmax


def build():
    torch.manual_seed(7)
    return LogProbabilities(), (torch.randn(3, 8) * 60,)
