"""A planted skipped collective: rank 1 takes a branch that leaves out an all_reduce its peers run, so its next
collective is an all_gather while they call all_reduce. Run for real, rank 1's all_gather would pair with their
all_reduce and the job would hang."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


class Skips(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        h = funcol.all_reduce(torch.sin(x * (self.rank + 1)), "sum", dist.group.WORLD)  # REDUCE
        if self.rank != 1:  # BUG: rank 1 skips the second all_reduce
            h = funcol.all_reduce(h * 2, "sum", dist.group.WORLD)  # SKIPPED
        g = funcol.all_gather_tensor(h, 0, dist.group.WORLD)  # GATHER
        return g.sum(0)


def build(rank, world_size):
    return Skips(rank), (torch.arange(4, dtype=torch.float32),)
