"""The torch driver's on-device checks of a write: digest, NaN/Inf, min/max/mean.

Three reductions on the device (digest, min/max, sum) make one int64 row, `pack`; `stats`
turns a row into WriteStats. `inspect` reads its row back at once (one host sync per write);
`TorchReadback` carries a batch of rows to the host in one asynchronous copy. Both take the
same path: NaN and Inf show in the row (min/max propagate a NaN, an Inf is an extreme), and
only a row that shows one (or an overflowed sum) is looked at closer, from its tensor, to
count them and take the stats of the finite elements. So the check that runs on every write
costs three passes over its bytes, and both ways write the same stats into the write log.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import torch

from hardware.driver import ChecksReadback, WriteStats


def digest(flat: torch.Tensor) -> torch.Tensor:
    """A checksum of the bytes computed on the device: the wrapping sum of their widest words.

    One pass, no temporaries; any change of one word changes it. It does not see a permutation
    of whole words, which no non-deterministic kernel produces without also changing values."""
    raw = flat.contiguous().view(torch.uint8)
    nbytes = raw.numel()
    for dtype, width in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if nbytes % width == 0:
            return raw.view(dtype).sum(dtype=torch.int64) + nbytes
    return raw.sum(dtype=torch.int64) + nbytes


def _elements(tensor: torch.Tensor) -> torch.Tensor:
    """The elements the stats describe: booleans as bytes, complex numbers by magnitude."""
    flat = tensor.reshape(-1)
    x = flat.view(torch.uint8) if flat.dtype == torch.bool else flat
    return x.abs() if x.is_complex() else x


def pack(tensor: torch.Tensor) -> torch.Tensor | None:
    """int64 [digest, min, max, sum] of a write (the floats as float64 bit patterns), computed on its device
    without waiting for it; None for an empty tensor. A narrow float sums in float32, an integer in float64."""
    if tensor.numel() == 0:
        return None
    x = _elements(tensor)
    total = x.sum(dtype=(torch.float32 if x.element_size() < 4 else None) if x.is_floating_point() else torch.float64)
    lo, hi = torch.aminmax(x)
    floats = torch.stack([lo.double(), hi.double(), total.double()]).view(torch.int64)
    return torch.cat([digest(tensor.reshape(-1)).reshape(1), floats])


def stats(row: list[int], tensor: torch.Tensor) -> WriteStats:
    """WriteStats from a packed row; a row showing a NaN, an Inf or an overflowed sum is looked at closer."""
    lo, hi, total = struct.unpack("<3d", struct.pack("<3q", *row[1:]))
    if math.isfinite(lo) and math.isfinite(hi) and math.isfinite(total):
        return WriteStats(row[0], 0, 0, lo, hi, total / tensor.numel())
    x = _elements(tensor)
    if math.isfinite(lo) and math.isfinite(hi):  # the sum overflowed its accumulator: redo it wide
        return WriteStats(row[0], 0, 0, lo, hi, float(x.sum(dtype=torch.float64)) / x.numel())
    # Count, then take the stats of the finite elements without compacting them (boolean indexing copies and
    # costs several times these passes).
    nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    finite = x.numel() - nan - inf
    if not finite:
        return WriteStats(row[0], nan, inf, math.nan, math.nan, math.nan)
    f_lo = torch.nan_to_num(x, nan=math.inf, posinf=math.inf, neginf=math.inf).amin()
    f_hi = torch.nan_to_num(x, nan=-math.inf, posinf=-math.inf, neginf=-math.inf).amax()
    f_total = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).sum(dtype=torch.float64)
    f_lo, f_hi, f_total = torch.stack([f_lo.double(), f_hi.double(), f_total]).tolist()
    return WriteStats(row[0], nan, inf, f_lo, f_hi, f_total / finite)


def inspect(tensor: torch.Tensor) -> WriteStats:
    """The stats of a write, read back at once: one host sync."""
    row = pack(tensor)
    return WriteStats.empty() if row is None else stats(row.tolist(), tensor)


class TorchReadback(ChecksReadback):
    """A batch of packed rows on its way to the host: one copy into pinned memory, ordered by an event (on a
    CUDA device); on the CPU the rows are host memory already."""

    def __init__(self, checks: list[torch.Tensor | None], tensors: list[Any]):
        self._checks, self._tensors = checks, tensors
        rows = [c for c in checks if c is not None]
        self._host: torch.Tensor | None = torch.stack(rows) if rows else None
        self._event = None
        if self._host is not None and self._host.is_cuda:
            device_rows = self._host
            self._host = torch.empty(device_rows.shape, dtype=torch.int64, pin_memory=True)
            self._host.copy_(device_rows, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def stats(self) -> list[WriteStats]:
        if self._event is not None:
            self._event.synchronize()
        rows = iter(self._host.tolist() if self._host is not None else [])
        return [WriteStats.empty() if check is None else stats(next(rows), tensor)
                for check, tensor in zip(self._checks, self._tensors)]
