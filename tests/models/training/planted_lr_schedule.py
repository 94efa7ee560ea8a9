"""A regression trained with Adam under a step schedule whose factor is written the wrong way round: StepLR's gamma
of 10 (meant 0.1) multiplies the learning rate by 10 every 2 steps, and from step 4 on the updates overshoot and
the loss climbs. Patching the learning rate from step 4 (`patch optimizer lr=0.005 --from-step 4`) keeps it down."""

import torch
from torch import nn


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.fit = nn.Linear(3, 1)

    def forward(self, x):
        return self.fit(x).squeeze(-1)


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 3, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5])


def train_step():
    torch.manual_seed(0)
    model = Regression()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=10.0)  # BUG: gamma=0.1 was meant
    return model, _batch(0), nn.functional.mse_loss, optimizer, scheduler


def batches():
    for step in range(100):
        yield _batch(step)
