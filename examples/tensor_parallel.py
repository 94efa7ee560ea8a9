"""Tensor parallelism, Megatron style: each block's first linear layer is split by columns and its second by rows
across the ranks, so a rank computes a slice of the hidden layer on its own and one all_reduce per block sums the
ranks' partial outputs. Debug it with `rewind debug examples/tensor_parallel.py --ranks 2` (or 4).

`reference()` is the same computation in one process with the whole weights: every rank's output equals it.
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn import functional as F

WIDTH, HIDDEN, BLOCKS = 8, 16, 2  # HIDDEN splits evenly over 1, 2 or 4 ranks


def whole_weights():
    """Every block's (first layer's weight [HIDDEN, WIDTH], second's [WIDTH, HIDDEN]) and the input, as one
    process would hold them."""
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(HIDDEN, WIDTH, generator=g) * 0.3, torch.randn(WIDTH, HIDDEN, generator=g) * 0.3)
               for _ in range(BLOCKS)]
    return weights, torch.randn(4, WIDTH, generator=g)


class ColumnParallelLinear(nn.Module):
    """This rank's rows of the weight: a slice of the output features, computed without talking to the others."""

    def __init__(self, weight, rank, world_size):
        super().__init__()
        self.weight = nn.Parameter(weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x):
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """This rank's columns of the weight: a partial sum of every output feature, summed over the ranks."""

    def __init__(self, weight, rank, world_size):
        super().__init__()
        self.weight = nn.Parameter(weight.chunk(world_size, dim=1)[rank].clone())
        self.world_size = world_size

    def forward(self, h):
        partial = F.linear(h, self.weight)
        if self.world_size == 1:
            return partial
        return funcol.all_reduce(partial, "sum", dist.group.WORLD)


class Block(nn.Module):
    def __init__(self, weights, rank, world_size):
        super().__init__()
        self.up = ColumnParallelLinear(weights[0], rank, world_size)
        self.down = RowParallelLinear(weights[1], rank, world_size)

    def forward(self, x):
        h = F.gelu(self.up(x))
        return x + self.down(h)


class TensorParallelMLP(nn.Module):
    def __init__(self, rank=0, world_size=1):
        super().__init__()
        weights, _ = whole_weights()
        self.blocks = nn.ModuleList(Block(w, rank, world_size) for w in weights)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build(rank, world_size):
    _, x = whole_weights()
    return TensorParallelMLP(rank, world_size), (x,)


def reference():
    """The output of one process holding the whole weights."""
    _, x = whole_weights()
    with torch.no_grad():
        return TensorParallelMLP()(x)
