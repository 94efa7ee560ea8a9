"""A training step as a PyTorch user writes it, in their own function: the model, optimizer and schedule are
variables of the file, and train_step(x, y) zeroes the gradients, runs two micro-batches (dropout in train mode),
calls backward() on each, clips the gradients' norm, steps the optimizer and the scheduler, and returns the loss
as a number. batches() yields each step's batch."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import clip_grad_norm_

MICRO = 2


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 32)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        h = self.drop(torch.relu(self.embed(x)))
        return self.head(h)


torch.manual_seed(0)
model = Classifier()
opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 3))


def train_step(x, y):
    model.train()
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for xb, yb in zip(x.chunk(MICRO), y.chunk(MICRO)):
        loss = F.cross_entropy(model(xb), yb) / MICRO
        loss.backward()
        total += loss.item()
    clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    schedule.step()
    return total


def batches():
    g = torch.Generator().manual_seed(1)
    while True:
        yield torch.randn(8, 6, generator=g) * 3, torch.randint(0, 3, (8,), generator=g)
