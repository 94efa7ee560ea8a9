"""Trusted implementations the planted candidates are compared with: torch's own operators."""

import torch
import torch.nn.functional as F


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)


def attention_inputs(keys=64):
    """One head's queries (64 positions, width 16), and `keys` keys and values."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 16, generator=g), torch.randn(keys, 16, generator=g), torch.randn(keys, 16, generator=g)


def norm_inputs():
    """Activations (32 rows of 24 features) with a row offset, and the norm's weight and bias."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 24, generator=g) + torch.arange(32.0).unsqueeze(1)
    return x, torch.randn(24, generator=g), torch.randn(24, generator=g)
