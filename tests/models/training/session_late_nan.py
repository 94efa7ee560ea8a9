"""A NaN only the backward makes, and only in step 2: its batch holds an exact 0 where the forward takes a log
(the log of 0 is -inf, discarded by the where, yet its gradient there is 0 / 0). Steps 0 and 1 train cleanly;
plain SGD, the forward returns the loss."""

import torch
from torch import nn


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x, y):
        h = x * self.scale
        safe = torch.where(h > 0, torch.log(h), torch.zeros_like(h))  # BUG: log's gradient at h == 0 is NaN
        target = y.clamp(min=0.0)  # the labels: nothing here is differentiated
        return ((safe - target) ** 2).mean()


def _batch(step: int):
    x = torch.tensor([[1.5, 2.0, 0.5, 3.0], [1.0, 0.75, 2.5, 0.25]]) + step / 10
    if step == 2:
        x[1, 1] = 0.0  # the one input that reaches the log as 0
    return x, torch.ones(2, 4)


def train_step():
    model = Regression()
    return model, _batch(0), torch.optim.SGD(model.parameters(), lr=0.1)


def batches():
    for step in range(3):
        yield _batch(step)
