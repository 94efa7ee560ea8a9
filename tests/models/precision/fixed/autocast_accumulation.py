"""Planted bug inside a CPU bfloat16 autocast region: features pooled over time by a running total. The linear runs
in bfloat16 under autocast, so the total starts as bfloat16 and every addition rounds it: past 256, bfloat16's
spacing is two units, and the increments of about one round away. Accumulating in float32 is right."""

import torch
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


def build():
    torch.manual_seed(1)
    return Pooled(), (torch.randn(4, 384, 16) * 0.3,)
