"""A precision bug on one rank: every rank sums the rows of its shard, and rank 1 alone (a rank-dependent branch)
sums them in float16, whose spacing at 1000 is 0.5: its sums lose the small parts that make them. The all_reduce
after it carries rank 1's error into every rank's total: on rank 0 every node before the collective is exact, and
the error first appears at the collective, from inputs of its own that agree with the float64 reference."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


class RowSums(nn.Module):
    def __init__(self, in_half: bool):
        super().__init__()
        self.in_half = in_half

    def forward(self, x):
        if self.in_half:
            sums = x.half().sum(-1).float()  # BUG: rank 1 sums in float16
        else:
            sums = x.sum(-1)
        total = funcol.all_reduce(sums, "sum", dist.group.WORLD)  # CARRIES: rank 1's error into every rank's total
        return total * 0.5


def build(rank, world_size):
    torch.manual_seed(9 + rank)
    signs = torch.tensor([1.0, -1.0]).repeat(2048)  # terms around ±1000 that cancel: the total is their small parts
    eighths = torch.randint(-16, 17, (4, 4096)) / 8.0  # float32 sums them exactly; float16 rounds each to 0.5
    return RowSums(in_half=rank == 1), (signs * 1000.0 + eighths,)
