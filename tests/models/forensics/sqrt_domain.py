"""Planted bug: standard deviation from the one-pass formula E[x^2] - E[x]^2 in float32.

The data sit far from zero, so the two means agree to almost every digit: their float32
difference is dominated by rounding and comes out negative, and sqrt() of it is NaN.
"""

import torch
from torch import nn


class OnePassStd(nn.Module):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        mean_sq = (x * x).mean(-1, keepdim=True)
        variance = mean_sq - mean * mean  # BUG: cancellation
        return (x - mean) / torch.sqrt(variance)  # NaN where the variance came out negative


def build():
    torch.manual_seed(5)
    return OnePassStd(), (1000.0 + 0.01 * torch.randn(6, 32),)
