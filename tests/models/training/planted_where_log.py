"""Log-counts of sparse features, the log taken only where a count is positive: the forward is finite (the `where`
discards log(0) = -inf), but the backward still differentiates the log at the zero counts: 0 / 0 is NaN there, and
it reaches the weights."""

import torch
from torch import nn


class LogCounts(nn.Module):
    def __init__(self):
        super().__init__()
        self.rate = nn.Parameter(torch.linspace(0.5, 1.5, 6))
        self.head = nn.Linear(6, 1)

    def forward(self, counts, target):
        scaled = counts * self.rate
        logs = torch.where(scaled > 0, torch.log(scaled), torch.zeros_like(scaled))  # BUG: log's gradient at 0 is NaN
        return ((self.head(logs).squeeze(-1) - target) ** 2).mean()


def train_step():
    torch.manual_seed(0)
    model = LogCounts()
    counts = torch.tensor([[3.0, 0.0, 1.0, 2.0, 0.0, 5.0], [1.0, 4.0, 0.0, 2.0, 6.0, 1.0],
                           [2.0, 2.0, 3.0, 0.0, 1.0, 4.0]])
    return model, (counts, torch.tensor([1.0, -0.5, 2.0])), torch.optim.SGD(model.parameters(), lr=0.05)
