"""Planted bug in a training step whose forward runs under CPU bfloat16 autocast: the running total of
autocast_accumulation.py, inside the region, so the pooled features, the loss and the gradients through them carry
its rounding."""

import torch
import torch.nn.functional as F
from torch import nn


class Pooled(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.out = nn.Linear(width, 4)
        with torch.no_grad():
            self.proj.bias.fill_(1.0)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.relu(self.proj(x))
            total = torch.zeros(h.shape[0], h.shape[2])
            for t in range(h.shape[1]):
                total = total + h[:, t].float()  # FIXED: a float32 total
            y = self.out(total / h.shape[1])
        return y.float()


def train_step():
    torch.manual_seed(1)
    model = Pooled()
    x, target = torch.randn(4, 384, 16) * 0.3, torch.tensor([0, 1, 2, 3])
    return model, (x, target), F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1)
