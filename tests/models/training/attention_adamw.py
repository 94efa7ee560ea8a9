"""A small attention block (layer norm, one head, residual) trained with AdamW on a mean-squared error."""

import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width, bias=False)  # a bias of the keys has no gradient: softmax ignores it
        self.v = nn.Linear(width, width)

    def forward(self, x):
        h = self.norm(x)
        scores = self.q(h) @ self.k(h).transpose(-2, -1) / math.sqrt(h.shape[-1])
        weights = torch.softmax(scores, dim=-1)
        return x + weights @ self.v(h)


def train_step():
    torch.manual_seed(0)
    model = Attention()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)
    x, target = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    return model, (x, target), nn.MSELoss(), optimizer
