"""Pipeline parallelism, GPipe style (the forward pass): each rank is one stage holding one block of the model, and
micro-batches flow through the stages by point-to-point sends and recvs (rank 0 -> 1 -> ... -> N-1); then one
all_reduce of the whole group sums each stage's activation energy. Debug it with
`rewind debug examples/pipeline_parallel.py --ranks 4` (or 2): a send and its recv run together, and the other
stages are free to run meanwhile.

`reference()` is the same computation in one process: the last stage's output and the summed energy equal it.
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn import functional as F

WIDTH, MICRO, BATCH = 8, 2, 3  # MICRO micro-batches of BATCH rows each


def weights(stages):
    """Each stage's weight [WIDTH, WIDTH] and the micro-batches [MICRO, BATCH, WIDTH], as one process holds them."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(WIDTH, WIDTH, generator=g) * 0.4 for _ in range(stages)], \
        torch.randn(MICRO, BATCH, WIDTH, generator=g)


class Stage(nn.Module):
    def __init__(self, weight, rank, world_size):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.rank, self.world_size = rank, world_size

    def forward(self, batches):
        outs = []
        for m in range(MICRO):
            if self.rank == 0:
                h = batches[m]
            else:  # the previous stage's activations of this micro-batch
                h = funcol.irecv_inplace(torch.zeros(BATCH, WIDTH), self.rank - 1)  # RECV
            h = torch.tanh(F.linear(h, self.weight))
            if self.rank < self.world_size - 1:
                funcol.isend_inplace(h, self.rank + 1)  # SEND
            outs.append(h)
        out = torch.stack(outs)
        energy = funcol.all_reduce(out.square().sum(), "sum", dist.group.WORLD)  # ENERGY: every stage's, summed
        return out, energy


def build(rank, world_size):
    stages, batches = weights(world_size)
    return Stage(stages[rank], rank, world_size), (batches,)


def reference(stages):
    """The last stage's output and the energy summed over the stages, in one process."""
    weight, batches = weights(stages)
    with torch.no_grad():
        energy, h = torch.zeros(()), batches
        for w in weight:
            h = torch.tanh(F.linear(h, w))
            energy = energy + h.square().sum()
        return h, energy
