"""A regression trained with Adam for 8 steps whose batch of step 6 was never normalised: its inputs come in 1000
times too large (a data-loading bug), and the loss of that step spikes; Adam's bounded update keeps the steps
after it near the loss they had."""

import torch
from torch import nn

STEPS = 8
SPIKE = 6  # the step whose batch is wrong


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.fit = nn.Linear(3, 1)

    def forward(self, x, y):
        return ((self.fit(x).squeeze(-1) - y) ** 2).mean()


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 3, generator=g)
    if step == SPIKE:
        x = x * 1e3  # BUG: this batch skipped normalisation
    return x, x.sum(-1)


def train_step():
    torch.manual_seed(0)
    model = Regression()
    return model, _batch(0), torch.optim.Adam(model.parameters(), lr=0.05)


def batches():
    for step in range(STEPS):
        yield _batch(step)
