"""A regression trained in float16 autocast with torch.amp.GradScaler as the recipe says (a mean loss, Adam): the
scaled gradients stay inside float16, no step is skipped, and the scale grows every 3 steps (growth_interval 3)."""

import torch
from torch import nn


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(8, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.float16):
            return self.out(torch.tanh(self.hidden(x))).float().squeeze(-1)


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 8, generator=g)
    return x, 4 * x[:, 0] - x[:, 1]


def train_step():
    torch.manual_seed(0)
    model = Regression()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    return model, _batch(0), nn.functional.mse_loss, optimizer, scaler


def batches():
    for seed in range(100):
        yield _batch(seed)
