"""Planted bug: an RMSNorm without an epsilon, in float32.

A row of zeros (padding) has mean square 0: rsqrt(0) is Inf and 0 * Inf is NaN, in float64
too, so the reference cannot say what the row should be. With an epsilon it is 0, and after
the bias it is the bias: `build` has a zero bias, `build_with_bias` a learned one, where
replacing the NaN by 0 at the output is wrong by the bias.
"""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        scale = torch.rsqrt((x * x).mean(-1, keepdim=True))  # BUG: no epsilon
        return x * scale * self.weight + self.bias


def build():
    torch.manual_seed(3)
    x = torch.randn(4, 8) * 4.0
    x[1] = 0.0  # a padding row
    return RMSNorm(), (x,)


def build_with_bias():
    model, inputs = build()
    with torch.no_grad():
        model.bias.copy_(torch.linspace(-0.2, 0.2, model.bias.numel()))
    return model, inputs


class RMSNormWithEpsilon(RMSNorm):
    """The model edited to prevent the NaN: an epsilon under the mean square."""

    def forward(self, x):
        scale = torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)
        return x * scale * self.weight + self.bias


class RMSNormMasked(RMSNorm):
    """The model edited to hide the NaN: born in the norm, replaced by 0 at the output."""

    def forward(self, x):
        return torch.nan_to_num(super().forward(x), nan=0.0)


def edited(cls):
    """`build_with_bias`'s model as the edited class, with the same parameters."""
    model, inputs = build_with_bias()
    copy = cls()
    copy.load_state_dict(model.state_dict())
    return copy, inputs


def build_with_epsilon():
    return edited(RMSNormWithEpsilon)


def build_masked():
    return edited(RMSNormMasked)
