"""Planted bug in a model that casts its parameters inside forward: the attention scores are taken in float16
before they are scaled, and large activations overflow float16's 65504 to inf (the softmax then writes NaN).
Scaling q first, or the scores in float32, is right."""

import torch
from torch import nn


class HalfScores(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.wq = nn.Parameter(torch.randn(width, width) * 4.0)
        self.wk = nn.Parameter(torch.randn(width, width) * 4.0)

    def forward(self, x):
        h = x.half()
        q = h @ self.wq.half()
        k = h @ self.wk.half()
        scores = q.float() @ k.float().transpose(0, 1) / 8.0  # FIXED: float32 scores
        weights = scores.softmax(-1)
        return weights.float()


def build():
    torch.manual_seed(0)
    return HalfScores(), (torch.randn(8, 64) * 3.0,)
