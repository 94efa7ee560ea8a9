"""A model with one 256 MiB intermediate (8192 x 8192 float32), for the variables-paging benchmark."""

import torch
from torch import nn


class Scale(nn.Module):
    def forward(self, x):
        big = x * 2.0
        total = big.sum(dim=0)
        return total


def build(side: int = 8192):
    torch.manual_seed(0)
    return Scale(), (torch.randn(side, side),)
