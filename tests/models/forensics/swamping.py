"""Planted bug (no NaN anywhere): a small value swamped by a large one in bfloat16.

`(h + offset) - offset` should give back h, but bfloat16 keeps 8 significant bits: next to an
offset of 1e4 its spacing is 64, so the add rounds h (about 1) away entirely. The add's result is
within its own relative tolerance; the subtraction that follows is the first node beyond it.
"""

import torch
from torch import nn


class Shifted(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.register_buffer("offset", torch.full((width,), 1e4))

    def forward(self, x):
        h = self.proj(x)
        shifted = h + self.offset  # BUG: h is lost against the offset in bfloat16
        back = shifted - self.offset
        return back * 2


def build():
    torch.manual_seed(6)
    return Shifted().to(torch.bfloat16), (torch.randn(4, 16).to(torch.bfloat16),)
