"""Models whose numbers go bad, each in one known way, at one known line."""

import torch
from torch import nn


class Normalise(nn.Module):
    """Scales each row by its spread: a constant row has spread 0, so its scaled values are 0/0 = NaN."""

    def forward(self, x):
        centred = x - x.mean(dim=-1, keepdim=True)
        spread = centred.abs().amax(dim=-1, keepdim=True)
        scaled = centred / spread
        return scaled


class Scaler(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = Normalise()

    def forward(self, x):
        y = self.norm(x)
        return y * 2


class Overflow(nn.Module):
    """exp of a large logit overflows float32 to Inf, and the Inf reaches the output."""

    def forward(self, x):
        gain = torch.exp(x * 100)
        return gain + 1


def normalise():
    x = torch.randn(3, 4)
    x[1] = 0.5  # a constant row
    return Scaler(), (x,)


def overflow():
    return Overflow(), (torch.tensor([[0.5, 1.0], [2.0, -1.0]]),)


class Logarithm(nn.Module):
    """log of a shifted input: elements below the shift are negative, their log is NaN."""

    def forward(self, x):
        shifted = x - 1
        return torch.log(shifted)


def logarithm():
    return Logarithm(), (torch.tensor([2.0, 0.5, 3.0]),)
