"""A correct model under CPU bfloat16 autocast, written as users write it: the linears run in bfloat16, the softmax
after the region in float32. Clean: every value is as accurate as the bfloat16 it was carried in."""

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, 8)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.relu(self.fc1(x))
            logits = self.fc2(h)
        return logits.float().softmax(-1)


def build():
    torch.manual_seed(0)
    return Classifier(), (torch.randn(4, 16),)
