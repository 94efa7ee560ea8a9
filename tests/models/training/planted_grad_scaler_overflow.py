"""A regression trained in float16 autocast with torch.amp.GradScaler, whose loss sums the squared errors of its
batch where it meant their mean: the gradient, times the scaler's 65536, overflows float16 in the backward of the
autocast linear, so GradScaler finds inf gradients, skips the optimizer's step and halves its scale, step after
step: for the first steps the model does not train at all."""

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


def sum_of_squares(prediction, target):
    return ((prediction - target) ** 2).sum()  # BUG: .mean() was meant; the sum's gradient overflows float16


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 8, generator=g)
    return x, 4 * x[:, 0] - x[:, 1]


def train_step():
    torch.manual_seed(0)
    model = Regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, _batch(0), sum_of_squares, optimizer, torch.amp.GradScaler("cpu")


def batches():
    for seed in range(100):
        yield _batch(seed)
