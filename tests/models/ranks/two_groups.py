"""2-D parallelism on 4 ranks: a DeviceMesh of 2 data-parallel replicas × 2 tensor-parallel shards. Within each
tensor-parallel group (ranks 0, 1 and ranks 2, 3) a row-parallel layer's partial sums are all-reduced; across each
data-parallel group (ranks 0, 2 and ranks 1, 3) the replicas' outputs are averaged. Every collective runs on a
subgroup of the world.

`mismatch`: in the tensor-parallel group of ranks 2 and 3, rank 3 gathers where rank 2 reduces, while ranks 0 and 1
are fine: the mismatch is caught in that group alone, naming its two ranks.
"""

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import init_device_mesh


def whole_weight():
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 0.5


def replica_input(replica):
    return torch.arange(16, dtype=torch.float32).reshape(2, 8) / 16 + replica


class TwoD(nn.Module):
    def __init__(self, mesh, rank, gather):
        super().__init__()
        self.cols = slice(4 * (rank % 2), 4 * (rank % 2) + 4)  # this tensor-parallel shard's input features
        self.weight = nn.Parameter(whole_weight()[:, self.cols].clone())
        self.tp, self.dp = mesh.get_group("tp"), mesh.get_group("dp")
        self.gather = gather

    def forward(self, x):
        partial = x[:, self.cols] @ self.weight.T
        if self.gather:
            h = funcol.all_gather_tensor(partial, 0, self.tp)  # GATHERS
        else:
            h = funcol.all_reduce(partial, "sum", self.tp)  # TP SUM
        return funcol.all_reduce(torch.tanh(h), "avg", self.dp)  # DP AVG


def _mesh():
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))


def build(rank, world_size):
    return TwoD(_mesh(), rank, gather=False), (replica_input(rank // 2),)


def mismatch(rank, world_size):
    return TwoD(_mesh(), rank, gather=rank == 3), (replica_input(rank // 2),)


def reference():
    """Every rank's output, in one process: the replicas' tanh(x @ W.T), averaged."""
    return torch.stack([torch.tanh(replica_input(d) @ whole_weight().T) for d in (0, 1)]).mean(0)
