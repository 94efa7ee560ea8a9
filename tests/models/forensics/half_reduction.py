"""Planted bug and its fix, one file: a float16 model whose row sums of float32 data are taken in float16.

The terms alternate around ±1000, where float16's spacing is 0.5: the float16 sum (`build`) loses
the small parts that make the total. The fix (`fixed`) sums in float32 and casts the total to
float16, as the model is compiled. Its sum is float16-accurate but not float32-accurate (each term
rounds by up to 3e-5 next to a total of about a hundred), which is all a float16 model can ask:
it is judged at float16, not at the float32 the fixed reduction happens to run in.
"""

import torch
from torch import nn


class Pooled(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.scale = nn.Parameter(torch.full((4,), 0.5))

    def forward(self, x):
        if self.fixed:
            total = x.sum(-1).half()  # FIXED: float32 reduction
        else:
            total = x.half().sum(-1)  # BUG: float16 reduction
        return total * self.scale


def _inputs() -> torch.Tensor:
    torch.manual_seed(9)
    signs = torch.tensor([1.0, -1.0]).repeat(2048)
    return signs * 1000.0 + 2.0 * torch.randn(4, 4096)


def build():
    return Pooled(fixed=False).half(), (_inputs(),)


def fixed():
    return Pooled(fixed=True).half(), (_inputs(),)
