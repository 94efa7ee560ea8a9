"""Planted bug: log(1 - sigmoid(z)) in float32.

For z above ~17, sigmoid(z) rounds to exactly 1 in float32, 1 - 1 is 0 and log(0) is -Inf
(in float64 it is about -z). torch.nn.functional.logsigmoid(-z) computes it stably.
"""

import torch
from torch import nn


class LogNotProb(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.score = nn.Linear(width, width)

    def forward(self, x):
        p = torch.sigmoid(self.score(x))
        return torch.log(1 - p)  # BUG: log of a value that rounds to zero


def build():
    torch.manual_seed(4)
    model = LogNotProb()
    with torch.no_grad():
        model.score.weight.mul_(30.0)
    return model, (torch.randn(3, 8),)
