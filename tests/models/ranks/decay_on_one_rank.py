"""Data-parallel replicas that drift from the second training step on: every rank averages its gradients over the
ranks, but rank 1's optimizer decays the bias, which starts at zero. In step 1 the decay adds nothing, so every
rank's bias agrees after the update; in step 2 it moves rank 1's bias away from its peers'."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn import functional as F


def average_over_ranks(grad):
    return funcol.all_reduce(grad, "sum", dist.group.WORLD) / dist.get_world_size()


def train_step(rank, world_size):
    torch.manual_seed(0)  # the same weight on every rank
    model = nn.Linear(4, 2)
    nn.init.zeros_(model.bias)
    for parameter in model.parameters():
        parameter.register_hook(average_over_ranks)
    decay = 0.5 if rank == 1 else 0.0  # BUG: only rank 1 decays the bias
    optimizer = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "weight_decay": decay}], lr=0.1)
    x = torch.linspace(-1.0, 1.0, 8).reshape(2, 4) + rank  # this rank's shard
    return model, (x, torch.ones(2, 2)), F.mse_loss, optimizer
