"""A float16 regression trained through a small auxiliary loss weight (the learning rate scaled up to match): the
gradient of the mean of 4096 squared errors times 5e-5 is below float16's smallest number and flushes to 0, so the
weights' gradient (the sum of those terms) is lost. Loss scaling keeps it."""

import torch
from torch import nn


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.fit = nn.Linear(8, 1, bias=False)

    def forward(self, x, y):
        return 5e-5 * ((self.fit(x).squeeze(-1) - y) ** 2).mean()  # BUG: its float16 gradient flushes to 0


def train_step():
    torch.manual_seed(0)
    model = Regression()
    nn.init.normal_(model.fit.weight, std=0.01)
    x, y = torch.randn(4096, 8) * 30, 0.01 * torch.randn(4096)
    return model.half(), (x.half(), y.half()), torch.optim.SGD(model.parameters(), lr=1.0)
