"""A clean mixed-precision model: float16 weights and activations, the softmax computed in float32
and cast back (what autocast does). Its casts down are what the reference pass makes no-ops."""

import torch
from torch import nn


class MixedAttention(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.qk = nn.Linear(width, width)

    def forward(self, x):
        h = self.qk(x)
        scores = (h @ h.transpose(-2, -1)).float() / 4.0
        weights = torch.softmax(scores, dim=-1).half()
        return weights @ x


def build():
    torch.manual_seed(8)
    return MixedAttention().half(), (torch.randn(6, 16).half(),)
