"""A classifier trained with SGD (momentum, dampening) under a warmup-then-decay learning-rate schedule
(torch.optim.lr_scheduler.LambdaLR): train_step() returns the scheduler after the optimizer, and each step's
learning rate is the schedule's."""

import torch
from torch import nn

WARMUP = 2


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 8)
        self.l2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)


def warmup_then_decay(step: int) -> float:
    return (step + 1) / WARMUP if step < WARMUP else 0.5 ** (step - WARMUP + 1)


def train_step():
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, dampening=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay)
    return model, _batch(0), nn.functional.cross_entropy, optimizer, scheduler


def batches():
    for seed in range(100):
        yield _batch(seed)
