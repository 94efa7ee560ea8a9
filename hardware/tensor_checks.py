"""The checks of a write held as a torch tensor: digest, NaN/Inf, min/max/mean. One definition for every
driver whose values are torch tensors (the torch driver on its device, the sim chip's and a trace's host
copies), so a digest recorded by one is checked on replay by another.

Three reductions on the tensor's device (digest, min/max, sum) make a `Check`: the digest's word sum and
[min, max, sum] in the sum's dtype. Four or five kernels a write: on a GPU each is a launch the
host pays for, so `pack` makes no other. `TensorReadback` carries a batch of them to the host, one
stacked column each (the torch driver's own readback makes that copy asynchronous on a GPU); `inspect`
is a batch of one read back at once. Both take the same path: NaN and Inf show in the row (min/max
propagate a NaN, an Inf is an extreme), and only a row that shows one (or an overflowed sum) is looked at
closer, from its tensor, to count them and take the stats of the finite elements. So the check that runs
on every write costs three passes over its bytes, and both ways write the same stats into the write log.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from hardware.driver import ChecksReadback, WriteStats


class Check(NamedTuple):
    """One write's checks, on its device: the digest's word sum (int64, 0-d) and [min, max, sum] (1-d)."""

    words: torch.Tensor
    extremes_sum: torch.Tensor


_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def word_sum(flat: torch.Tensor) -> torch.Tensor:
    """The wrapping int64 sum of a 1-d tensor's bytes read as their widest words: one pass, no temporaries."""
    nbytes = flat.numel() * flat.element_size()
    width = min(8, nbytes & -nbytes)  # the widest power of two dividing it
    return flat.contiguous().view(_WORDS[width]).sum(dtype=torch.int64)


def _wrap64(n: int) -> int:
    return (n + (1 << 63)) % (1 << 64) - (1 << 63)


def digest_of(words: int, tensor: torch.Tensor) -> int:
    """A checksum of a tensor's bytes from their word sum: any change of one word changes it. It does not see
    a permutation of whole words, which no non-deterministic kernel produces without also changing values."""
    return _wrap64(words + tensor.numel() * tensor.element_size())


def _elements(flat: torch.Tensor) -> torch.Tensor:
    """The elements the stats describe: booleans as bytes, complex numbers by magnitude."""
    x = flat.view(torch.uint8) if flat.dtype == torch.bool else flat
    return x.abs() if x.is_complex() else x


def _sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """A narrow float sums in float32, an integer in float64 (a float32 sum in float64 is 20x slower on a CPU)."""
    if dtype.is_floating_point:
        return torch.float32 if dtype.itemsize < 4 else dtype
    return torch.float64


def pack(tensor: torch.Tensor) -> Check | None:
    """The checks of a write, computed on its device without waiting for them; None for an empty tensor."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return None
    x = _elements(flat)
    wide = _sum_dtype(x.dtype)
    total = x.sum(dtype=wide)
    lo, hi = torch.aminmax(x)
    if lo.dtype != wide:
        lo, hi = lo.to(wide), hi.to(wide)
    return Check(word_sum(flat), torch.stack([lo, hi, total]))


def stats(words: int, extremes_sum: list[float], tensor: torch.Tensor) -> WriteStats:
    """WriteStats from a Check read back; a row showing a NaN, an Inf or an overflowed sum is looked at closer."""
    lo, hi, total = extremes_sum
    digest_ = digest_of(words, tensor)
    if math.isfinite(lo) and math.isfinite(hi) and math.isfinite(total):
        return WriteStats(digest_, 0, 0, lo, hi, total / tensor.numel())
    x = _elements(tensor.reshape(-1))
    if math.isfinite(lo) and math.isfinite(hi):  # the sum overflowed its accumulator: redo it wide
        return WriteStats(digest_, 0, 0, lo, hi, float(x.sum(dtype=torch.float64)) / x.numel())
    # Count, and take the stats of the finite elements without compacting them (boolean indexing copies and
    # costs several times these passes), all read back at once: on a GPU each read is a host sync in the middle of
    # a run, and a masked attention writes an Inf in every layer.
    f_lo = torch.nan_to_num(x, nan=math.inf, posinf=math.inf, neginf=math.inf).amin()
    f_hi = torch.nan_to_num(x, nan=-math.inf, posinf=-math.inf, neginf=-math.inf).amax()
    f_total = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).sum(dtype=torch.float64)
    nan, inf, f_lo, f_hi, f_total = torch.stack([torch.isnan(x).sum().double(), torch.isinf(x).sum().double(),
                                                 f_lo.double(), f_hi.double(), f_total]).tolist()
    nan, inf = int(nan), int(inf)
    finite = x.numel() - nan - inf
    if not finite:
        return WriteStats(digest_, nan, inf, math.nan, math.nan, math.nan)
    return WriteStats(digest_, nan, inf, f_lo, f_hi, f_total / finite)


def inspect(tensor: torch.Tensor) -> WriteStats:
    """The stats of a write, read back at once: one host sync."""
    return TensorReadback([pack(tensor)], [tensor]).stats()[0]


class TensorReadback(ChecksReadback):
    """A batch of Checks read back to the host: each column stacked (one kernel each) and read when asked."""

    def __init__(self, checks: list[Check | None], tensors: list[Any]):
        self._checks, self._tensors = checks, tensors
        packed = [c for c in checks if c is not None]
        # stack promotes: a batch mixing float32 and float64 rows reads back as float64
        self._columns = [torch.stack(column) for column in zip(*packed)]

    def ready(self) -> bool:
        return True

    def stats(self) -> list[WriteStats]:
        rows = zip(*(column.tolist() for column in self._columns))
        return [WriteStats.empty() if check is None else stats(*next(rows), tensor)
                for check, tensor in zip(self._checks, self._tensors)]
