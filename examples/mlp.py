"""A three-layer MLP: the smallest model worth stepping through."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, 2 * width)
        self.fc3 = nn.Linear(2 * width, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.tanh(self.fc2(h))
        return self.fc3(h)


def build():
    torch.manual_seed(2)
    return MLP(), (torch.randn(3, 8),)
