"""Data parallelism: every rank holds the same parameters and trains on its own shard of the batch; a gradient hook
all-reduces each parameter's gradient (averaged over the ranks) before the optimizer's update, so the replicated
parameters stay identical on every rank. Debug one training step with
`rewind debug examples/data_parallel.py --entry train_step --ranks 2` (or 4), and N steps with `--steps N`.

`reference(steps)` is the same steps in one process on the whole batch: every rank's trained parameters equal it.
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn import functional as F

WIDTH, HIDDEN, OUT, BATCH = 8, 16, 4, 8  # BATCH splits evenly over 1, 2 or 4 ranks


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def average_over_ranks(grad):
    """A gradient averaged over the ranks (gloo has no average: a sum, divided)."""
    return funcol.all_reduce(grad, "sum", dist.group.WORLD) / dist.get_world_size()


def whole_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, OUT, generator=g)


def _step(model):
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(rank, world_size):
    torch.manual_seed(0)  # the same initial parameters on every rank
    model, optimizer = _step(MLP())
    if world_size > 1:
        for parameter in model.parameters():
            parameter.register_hook(average_over_ranks)
    x, y = (t.chunk(world_size)[rank] for t in whole_batch())
    return model, (x, y), F.mse_loss, optimizer


def reference(steps=1):
    """The parameters after `steps` steps in one process on the whole batch, by module path."""
    torch.manual_seed(0)
    model, optimizer = _step(MLP())
    x, y = whole_batch()
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}
