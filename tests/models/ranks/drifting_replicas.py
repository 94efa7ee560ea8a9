"""Data-parallel replicas that drift: every rank holds the same weight and applies the same all_reduced gradient to
it, but with a step size that depends on the rank (a tiny difference), so each rank's replica of the updated weight
differs from its peers' by about 1e-3 of the update; the all_reduce after the update does not make them agree."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


class DriftingReplicas(nn.Module):
    def __init__(self, rank, world_size):
        super().__init__()
        self.world_size = world_size
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, 8).reshape(2, 4))  # the same on every rank
        self.step_size = 0.1 * (1.0 + 1e-3 * rank)  # BUG: a step size that depends on the rank

    def forward(self, x):
        local = torch.tanh(x @ self.w.T)  # this rank's batch
        grad = funcol.all_reduce(local.T @ x, "sum", dist.group.WORLD) / self.world_size  # REDUCE
        scaled = grad * self.step_size  # DRIFT: the replicas' update differs from here on
        updated = self.w - scaled  # UPDATE
        return funcol.all_reduce(x @ updated.T, "sum", dist.group.WORLD)  # SPREAD


def build(rank, world_size):
    shard = torch.arange(8, dtype=torch.float32).reshape(2, 4) * 0.1 + rank
    return DriftingReplicas(rank, world_size), (shard,)
