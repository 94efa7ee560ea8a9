"""An MLP trained in train mode with dropout (a module and a functional call) and input noise (randn_like); SGD with
momentum; batches() gives 3 batches (drawn from a generator of their own)."""

import torch
from torch import nn
import torch.nn.functional as F


class NoisyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(5, 32)
        self.drop = nn.Dropout(0.3)
        self.l2 = nn.Linear(32, 3)

    def forward(self, x):
        x = x + 0.05 * torch.randn_like(x)
        hidden = self.drop(torch.relu(self.l1(x)))
        return self.l2(F.dropout(hidden, p=0.1, training=self.training))


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 5, generator=g), torch.randint(0, 3, (16,), generator=g)


def train_step():
    torch.manual_seed(0)
    model = NoisyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, _batch(0), nn.CrossEntropyLoss(), optimizer


def batches():
    for seed in range(3):
        yield _batch(seed)
