"""A 2-layer MLP trained with SGD (momentum, weight decay) on a cross-entropy loss; batches() gives 3 batches."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 8)
        self.l2 = nn.Linear(8, 3)

    def forward(self, x):
        hidden = torch.relu(self.l1(x))
        return self.l2(hidden)


def loss_fn(logits, labels):
    return nn.functional.cross_entropy(logits, labels)


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)


def train_step():
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    return model, _batch(0), loss_fn, optimizer


def batches():
    for seed in range(3):
        yield _batch(seed)
