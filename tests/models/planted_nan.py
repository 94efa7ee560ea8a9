"""A planted NaN: a square root of values pushed below zero, on one known line (marked below)."""

import torch
from torch import nn


class Planted(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc(x)
        shifted = h - 10.0
        root = torch.sqrt(shifted)  # NaN: every element of `shifted` is negative
        return self.out(root)


def build():
    torch.manual_seed(0)
    return Planted(), (torch.randn(2, 8),)
