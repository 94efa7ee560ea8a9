"""Intended infinities (no bug in `build`): relative-position buckets as T5 computes them.

log(0) = -inf where a distance is 0; the cast to an integer bucket and the `where` that keeps small
distances as they are discard it before any output, and the float64 reference computes the same
-inf. `leaky` also returns the log of a shifted output, whose minimum is 0: that -inf reaches an
output and is a problem.
"""

import torch
from torch import nn


class Buckets(nn.Module):
    def __init__(self, leaky: bool = False, exact: int = 2):
        super().__init__()
        self.leaky, self.exact = leaky, exact
        self.embed = nn.Embedding(8, 4)

    def forward(self, distance):
        scaled = torch.log(distance.float() / self.exact) * 2  # ABSORBED: log(0) = -inf where the distance is 0
        large = self.exact + scaled.to(torch.long).clamp(0, 5)
        bucket = torch.where(distance < self.exact, distance, large)
        out = self.embed(bucket)
        if self.leaky:
            return torch.log(out - out.min())  # REACHES: log(0) = -inf in the output
        return out


def _distances() -> torch.Tensor:
    return torch.arange(12).reshape(3, 4) % 7


def build():
    torch.manual_seed(1)
    return Buckets(), (_distances(),)


def leaky():
    torch.manual_seed(1)
    return Buckets(leaky=True), (_distances(),)
