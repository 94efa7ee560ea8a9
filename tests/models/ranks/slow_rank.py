"""Rank 1 multiplies a big matrix many times before the all_reduce every rank calls: its peers wait at the
collective long past a short timeout, as they would behind a rank stuck in a data-dependent loop."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

SIZE, ROUNDS = 1200, 150  # seconds of work on any machine; the test ends it after 2


class Slow(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank
        self.weight = nn.Parameter(torch.eye(SIZE) * 0.5)

    def forward(self, x):
        h = x
        if self.rank == 1:
            for _ in range(ROUNDS):
                h = h @ self.weight  # SLOW
        return funcol.all_reduce(h[:2, :4], "sum", dist.group.WORLD)  # REDUCE


def build(rank, world_size):
    return Slow(rank), (torch.ones(SIZE, SIZE),)
