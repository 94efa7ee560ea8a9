"""One decode step of attention with a KV cache held in module buffers (mutated in place)."""

import torch
from torch import nn


class CachedAttention(nn.Module):
    def __init__(self, width: int = 16, context: int = 8, filled: int = 4):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.filled = filled
        self.register_buffer("k_cache", torch.randn(1, context, width))
        self.register_buffer("v_cache", torch.randn(1, context, width))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        pos = self.filled
        self.k_cache[:, pos : pos + 1] = k
        self.v_cache[:, pos : pos + 1] = v
        keys = self.k_cache[:, : pos + 1]
        values = self.v_cache[:, : pos + 1]
        scores = q @ keys.transpose(1, 2) / keys.shape[-1] ** 0.5
        return torch.softmax(scores, dim=-1) @ values


def build():
    torch.manual_seed(1)
    model = CachedAttention()
    return model, (torch.randn(1, 1, 16),)
