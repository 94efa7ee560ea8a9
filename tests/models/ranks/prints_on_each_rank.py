"""Every rank prints while it builds: which shard it loads, a line made by two prints, bytes that are no UTF-8, and a
word on stderr; its forward sums the ranks' values once. What a rank prints reaches the client under its rank
(docs/ranks.md, "What the ranks print")."""

import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


class Shard(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        h = torch.sin(x * (self.rank + 1))
        s = funcol.all_reduce(h, "sum", dist.group.WORLD)  # REDUCE
        return torch.cos(s) + 1


def build(rank, world_size):
    print(f"loading shard {rank} of {world_size}")
    print("weights: ", end="")
    print(f"{rank + 1} × 4 ✓")
    sys.stdout.flush()
    sys.stdout.buffer.write(b"raw \xff\xfe\n")
    print(f"rank {rank} warns on stderr", file=sys.stderr)
    return Shard(rank), (torch.arange(4, dtype=torch.float32),)


def build_chatty(rank, world_size):
    """1.5 MiB of lines on each rank, over the limit of what a rank's prints show."""
    for _ in range(1536):
        print("x" * 1023)
    return build(rank, world_size)
