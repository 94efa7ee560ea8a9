"""A planted NaN on one rank: every rank takes the square root of its shard less one, and only rank 1's shard holds
a 0 (a rank-dependent condition: the data, not the program, differs), so rank 1 alone makes a NaN. The all_reduce
after it carries that NaN into every rank's sum: on the other ranks the NaN appears at the collective, from finite
inputs. `relay` (2 ranks) passes it on in two hops: an all_to_all_single carries rank 1's NaN to rank 0 alone, and
an all_reduce carries it from rank 0 back into rank 1's sum."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


class PlantedNan(nn.Module):
    def forward(self, x):
        h = torch.sqrt(x - 1.0)  # BUG: a NaN where the shard holds a 0 (only rank 1's does)
        s = funcol.all_reduce(h * 2.0, "sum", dist.group.WORLD)  # SPREAD
        return torch.tanh(s)


class RelayedNan(nn.Module):
    def forward(self, x):
        h = torch.sqrt(x - 1.0)  # BUG, relayed: the same NaN on rank 1
        a = funcol.all_to_all_single(h, None, None, dist.group.WORLD)  # RELAY: rank 1's first half goes to rank 0
        return funcol.all_reduce(a + 1.0, "sum", dist.group.WORLD)  # RELAYED


def _shard(rank):
    return torch.arange(4, dtype=torch.float32) + (1.0 if rank != 1 else 0.0)


def build(rank, world_size):
    return PlantedNan(), (_shard(rank),)


def relay(rank, world_size):
    return RelayedNan(), (_shard(rank),)
