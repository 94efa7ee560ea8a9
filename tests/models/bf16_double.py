"""A bfloat16 model: setVariable must encode elements numpy has no dtype for."""

import torch
from torch import nn
class M(nn.Module):
    def forward(self, x):
        return (x * 2).sum()
def build():
    return M(), (torch.ones(3, dtype=torch.bfloat16),)
