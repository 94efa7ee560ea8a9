"""The fix of layer_norm.py: the mean is taken over each row's features."""

import torch

from reference import norm_inputs


def layer_norm(x, weight, bias):
    given = x.dtype
    x = x.to(torch.promote_types(given, torch.float32))  # the statistics in float32 at least
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=-1, keepdim=True)
    normed = centered * torch.rsqrt(var + 1e-5)
    return (normed * weight + bias).to(given)


def inputs():
    return norm_inputs()
