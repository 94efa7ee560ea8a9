"""Two flags raised mid-run, away from any batch boundary: a NaN (a square root of negatives) and, on
another branch, an Inf (an exponential that overflows). Everything after them carries them on."""

import torch
from torch import nn


class LateFlags(nn.Module):
    def forward(self, x):
        h = x * 2.0
        h = h + 1.0
        h = h * 0.5
        h = h - 0.25
        root = torch.sqrt(h - 3.0)  # NaN where h < 3
        root = root * 2.0
        root = root + 1.0
        g = x * 3.0
        g = g + 2.0
        g = g * 0.5
        g = g - 0.5
        g = g * 1.5
        big = torch.exp(g * 100.0)  # Inf where g > 0.89
        big = big + 1.0
        big = big * 0.5
        return root + big


def build():
    return LateFlags(), (torch.linspace(-2.0, 6.0, 64).reshape(8, 8),)
