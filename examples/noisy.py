"""A model with a non-deterministic op: noise drawn at run time, different on every replay."""

import torch
from torch import nn


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        h = h + torch.randn_like(h) * 0.1
        return torch.relu(h)


def build():
    torch.manual_seed(3)
    return Noisy(), (torch.randn(2, 8),)
