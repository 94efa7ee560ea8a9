"""A layer norm written out by hand. Planted: the mean is taken over the rows (dim=0) instead of each row's
features; layer_norm_fixed.py is the fix."""

import torch

from reference import norm_inputs


def layer_norm(x, weight, bias):
    given = x.dtype
    x = x.to(torch.promote_types(given, torch.float32))  # the statistics in float32 at least
    mean = x.mean(dim=0, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=-1, keepdim=True)
    normed = centered * torch.rsqrt(var + 1e-5)
    return (normed * weight + bias).to(given)


def inputs():
    return norm_inputs()
