"""Rank 1's build() ends its process (sys.exit), as a script that gives up would."""

import sys

import torch
from torch import nn


def build(rank, world_size):
    if rank == 1:
        print("rank 1 gives up")
        sys.exit(3)
    return nn.Linear(4, 4), (torch.ones(2, 4),)
