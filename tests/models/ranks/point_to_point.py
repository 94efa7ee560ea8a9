"""Point-to-point sends and recvs between ranks (torch.distributed's functional isend_inplace, irecv_inplace and
batch_p2p_ops_inplace), right and wrong.

`build` (2 ranks): rank 0 sends its activations to rank 1, which receives them and goes on.
`ring` (any ranks): each rank sends its shard to the next rank and receives the previous one's in one batch (a ring
exchange: with blocking sends in a loop it would deadlock), then an all_reduce.
`deadlock` (2 ranks): each rank sends to the other first and receives after: neither send has a recv waiting.
`sizes` (2 ranks): rank 0 sends 8 elements, and rank 1 receives 4.
`unmatched` (2 ranks): rank 0 sends twice and rank 1 receives once, then both call an all_reduce.
`nan` (2 ranks): rank 0 makes a NaN (the square root of a negative number), sends it to rank 1, and rank 1's
output carries it.
`relay` (3 ranks): rank 0 makes a NaN and sends it to rank 1, which sends it on to rank 2.
`misshapen` and `misnamed` (2 ranks): a batch with more ops than peers, and one naming torch's P2POp spelling 'send'.
`half_batched` (2 ranks): rank 0 sends and receives in one batch; rank 1 receives, then sends, in two nodes (gloo and
NCCL run it; Rewind crosses a batch only with every partner waiting at once).
`ring_nan` (3 ranks): the ring's exchange, where ranks 0 and 1 each make a NaN: rank 2 receives rank 1's only.
`beside` (4 ranks): ranks 0 and 1 both send first (a deadlock), while rank 2 sends to rank 3 on its own.
`precision` (2 ranks): rank 0 sums its rows in float16 (whose spacing at 1000 is 0.5: the small parts are lost) and
sends the sums to rank 1, whose own nodes are exact: its error comes in with the recv.
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


class Stage(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        if self.rank == 0:
            h = torch.sin(x)
            funcol.isend_inplace(h, 1)  # SEND
            return h
        h = funcol.irecv_inplace(torch.zeros_like(x), 0)  # RECV
        return h * 2


class Ring(nn.Module):
    def __init__(self, rank, world_size):
        super().__init__()
        self.rank, self.world_size = rank, world_size

    def forward(self, x):
        after, before = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        sent, got = funcol.batch_p2p_ops_inplace(["isend", "irecv"], [after, before], [0, 0],  # EXCHANGE
                                                 [x * 2, torch.zeros_like(x)], dist.group.WORLD)
        return funcol.all_reduce(got + 1, "sum", dist.group.WORLD)  # SUM


class Deadlock(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.peer = 1 - rank

    def forward(self, x):
        funcol.isend_inplace(x + 1, self.peer)  # BOTH SEND
        got = funcol.irecv_inplace(torch.zeros_like(x), self.peer)  # BOTH RECV
        return got * 3


class Sizes(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        if self.rank == 0:
            funcol.isend_inplace(torch.cat([x, x]), 1)  # SENDS 8
            return x
        return funcol.irecv_inplace(torch.zeros_like(x), 0)  # RECEIVES 4


class Unmatched(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        if self.rank == 0:
            funcol.isend_inplace(x, 1)  # FIRST SEND
            funcol.isend_inplace(x + 1, 1)  # SECOND SEND
            y = x
        else:
            y = funcol.irecv_inplace(torch.zeros_like(x), 0)  # ONLY RECV
        return funcol.all_reduce(y, "sum", dist.group.WORLD)  # THEN SUM


class Nan(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        if self.rank == 0:
            h = torch.sqrt(x - 2.0)  # BORN
            funcol.isend_inplace(h, 1)  # CARRIES
            return h
        got = funcol.irecv_inplace(torch.zeros_like(x), 0)  # ARRIVES
        return got + 1


class HalfSums(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        if self.rank == 0:
            sums = x.half().sum(-1).float()  # BUG: rank 0 sums in float16
            funcol.isend_inplace(sums, 1)  # SENDS SUMS
            return sums
        got = funcol.irecv_inplace(torch.zeros(x.shape[0]), 0)  # GETS SUMS
        return got * 0.5


class Relay(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        if self.rank == 0:
            h = torch.sqrt(x - 2.0)  # RELAY BORN
            funcol.isend_inplace(h, 1)
            return h
        got = funcol.irecv_inplace(torch.zeros_like(x), self.rank - 1)
        if self.rank == 1:
            funcol.isend_inplace(got * 3, 2)  # RELAYS
        return got + 1


class RingNan(nn.Module):
    def __init__(self, rank, world_size):
        super().__init__()
        self.after, self.before = (rank + 1) % world_size, (rank - 1) % world_size

    def forward(self, x):
        h = torch.sqrt(x)  # RING BORN: a NaN where the shard is negative (ranks 0 and 1)
        sent, got = funcol.batch_p2p_ops_inplace(["isend", "irecv"], [self.after, self.before], [0, 0],  # PASS ON
                                                 [h, torch.zeros_like(x)], dist.group.WORLD)
        return got + 1


class Batch(nn.Module):
    def __init__(self, kinds, peers):
        super().__init__()
        self.kinds, self.peers = kinds, peers

    def forward(self, x):
        out = funcol.batch_p2p_ops_inplace(self.kinds, self.peers, [0] * len(self.peers),  # BATCH
                                           [x + 1, torch.zeros_like(x)], dist.group.WORLD)
        return out[1] * 2


class HalfBatched(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        if self.rank == 0:
            sent, got = funcol.batch_p2p_ops_inplace(["isend", "irecv"], [1, 1], [0, 0],  # BOTH AT ONCE
                                                     [x + 1, torch.zeros_like(x)], dist.group.WORLD)
            return got * 2
        got = funcol.irecv_inplace(torch.zeros_like(x), 0)  # FIRST RECV
        funcol.isend_inplace(got + 5, 0)  # THEN SEND
        return got


class Beside(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        if self.rank < 2:
            funcol.isend_inplace(x + 1, 1 - self.rank)
            return funcol.irecv_inplace(torch.zeros_like(x), 1 - self.rank) * 3
        if self.rank == 2:
            funcol.isend_inplace(x * 2, 3)
            return x
        return funcol.irecv_inplace(torch.zeros_like(x), 2)


def _x():
    return torch.arange(4, dtype=torch.float32)


def build(rank, world_size):
    return Stage(rank), (_x(),)


def ring(rank, world_size):
    return Ring(rank, world_size), (_x() + 10 * rank,)


def deadlock(rank, world_size):
    return Deadlock(rank), (_x(),)


def sizes(rank, world_size):
    return Sizes(rank), (_x(),)


def unmatched(rank, world_size):
    return Unmatched(rank), (_x(),)


def nan(rank, world_size):
    return Nan(rank), (_x(),)


def relay(rank, world_size):
    return Relay(rank), (_x(),)


def ring_nan(rank, world_size):
    return RingNan(rank, world_size), (_x() - (3.0 if rank < 2 else 0.0),)


def misshapen(rank, world_size):
    return Batch(["isend", "irecv"], [1 - rank]), (_x(),)


def misnamed(rank, world_size):
    return Batch(["send", "irecv"], [1 - rank, 1 - rank]), (_x(),)


def half_batched(rank, world_size):
    return HalfBatched(rank), (_x(),)


def beside(rank, world_size):
    return Beside(rank), (_x(),)


def precision(rank, world_size):
    torch.manual_seed(9)
    signs = torch.tensor([1.0, -1.0]).repeat(2048)  # terms around ±1000 that cancel: the total is their small parts
    eighths = torch.randint(-16, 17, (4, 4096)) / 8.0  # float32 sums them exactly; float16 rounds each to 0.5
    return HalfSums(rank), (signs * 1000.0 + eighths,)
