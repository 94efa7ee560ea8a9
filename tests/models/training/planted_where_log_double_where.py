"""planted_where_log.py fixed by hand with the double where: the log's argument is made safe (1) where the outer
`where` discards it, so the backward differentiates the log at 1, not at 0."""

import torch
from torch import nn


class LogCounts(nn.Module):
    def __init__(self):
        super().__init__()
        self.rate = nn.Parameter(torch.linspace(0.5, 1.5, 6))
        self.head = nn.Linear(6, 1)

    def forward(self, counts, target):
        scaled = counts * self.rate
        positive = scaled > 0  # the double where: the log never sees a 0, so neither does its gradient
        logs = torch.where(positive, torch.log(torch.where(positive, scaled, 1.0)), torch.zeros_like(scaled))
        return ((self.head(logs).squeeze(-1) - target) ** 2).mean()


def train_step():
    torch.manual_seed(0)
    model = LogCounts()
    counts = torch.tensor([[3.0, 0.0, 1.0, 2.0, 0.0, 5.0], [1.0, 4.0, 0.0, 2.0, 6.0, 1.0],
                           [2.0, 2.0, 3.0, 0.0, 1.0, 4.0]])
    return model, (counts, torch.tensor([1.0, -0.5, 2.0])), torch.optim.SGD(model.parameters(), lr=0.05)
