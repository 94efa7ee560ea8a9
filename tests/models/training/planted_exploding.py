"""A gain applied 16 times in a row: its gradient grows as gain ** 15, so each step's update throws the gain further
off, and step 2's product overflows float32. Clipping the gradients' norm keeps the steps small."""

import torch
from torch import nn

DEPTH = 16


class DeepGain(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.full((4,), 1.1))

    def forward(self, x, y):
        h = x
        for _ in range(DEPTH):
            h = h * self.gain  # BUG: the gradient of a 16-fold product of the gain explodes
        return ((h - y) ** 2).mean()


def train_step():
    torch.manual_seed(0)
    x = torch.rand(3, 4) + 0.5
    model = DeepGain()
    return model, (x, torch.ones(3, 4)), torch.optim.SGD(model.parameters(), lr=0.05)
