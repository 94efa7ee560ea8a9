"""Frames, scopes and the names a user wrote: module arguments, tuple unpacking, aliases, subscripts.

`build()` is clean; `zero_row()` has eps 0 and an input row of zeros, so the norm's last line writes a NaN
(0 * inf) and the next node runs in another module (Attention), on another line.
"""

import torch
from torch import nn


class Norm(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        scale = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(scale + self.eps)  # NaN where a row of x is all zeros and eps is 0


class Attention(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.score = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)

    def forward(self, hidden):
        weights = torch.softmax(self.score(hidden), dim=-1)
        out = self.proj(weights * hidden)
        return out, weights


class Block(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.norm = Norm(eps)
        self.attn = Attention(width)

    def forward(self, h):
        residual = h
        h = self.norm(h * 2)
        attn_output, _ = self.attn(h)
        h = residual + attn_output
        return h, attn_output


class Model(nn.Module):
    def __init__(self, width: int = 8, eps: float = 1e-6):
        super().__init__()
        self.block = Block(width, eps)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        outputs = self.block(x)
        hidden = outputs[0]
        return self.head(hidden)


def build():
    torch.manual_seed(0)
    return Model().eval(), (torch.randn(2, 8),)


def zero_row():
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    x[1] = 0.0
    return Model(eps=0.0).eval(), (x,)


class Wrapper(nn.Module):
    """The model inside a module of the user's own: at the end the stack is Model.forward's, inside this one."""

    def __init__(self):
        super().__init__()
        self.model = Model()

    def forward(self, x):
        return self.model(x * 2)


def wrapped():
    torch.manual_seed(0)
    return Wrapper().eval(), (torch.randn(2, 8),)
