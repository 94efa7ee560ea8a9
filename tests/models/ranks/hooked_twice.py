"""A data-parallel training step whose rank 1 registers its gradient hook twice: each step, rank 0 all-reduces the
weight's gradient once and rank 1 twice. Each of those all_reduces matches its peer's in op and shape, so gloo pairs
rank 1's second all_reduce of step 0 with rank 0's of step 1, and the job hangs in step 1, where rank 1 calls a
third all_reduce that rank 0 never calls."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn import functional as F


def average_over_ranks(grad):
    return funcol.all_reduce(grad, "sum", dist.group.WORLD) / dist.get_world_size()  # REDUCE


def train_step(rank, world_size):
    torch.manual_seed(0)
    model = nn.Linear(4, 2, bias=False)
    for _ in range(2 if rank == 1 else 1):  # BUG: rank 1 registers the hook twice
        model.weight.register_hook(average_over_ranks)
    x = torch.linspace(-1.0, 1.0, 8).reshape(2, 4) + rank  # this rank's shard
    return model, (x, torch.ones(2, 2)), F.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1)
