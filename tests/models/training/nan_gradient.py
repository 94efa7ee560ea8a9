"""A NaN that only the backward makes: the forward is finite where it matters (the log of 0 is -inf but not
selected), yet the log's gradient there is 0 / 0. The forward returns the loss; plain SGD."""

import torch
from torch import nn


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x, y):
        h = x * self.scale
        safe = torch.where(h > 0, torch.log(h), torch.zeros_like(h))  # BUG: log's gradient at h == 0 is NaN
        return ((safe - y) ** 2).mean()


def train_step():
    model = Regression()
    x = torch.tensor([[1.5, 2.0, 0.5, 3.0], [1.0, 0.0, 2.5, 0.25]])
    return model, (x, torch.ones(2, 4)), torch.optim.SGD(model.parameters(), lr=0.1)
