"""The checks of a write held as a torch tensor: digest, NaN/Inf counts, min/max/mean. One definition for every
driver whose values are torch tensors (the torch driver on its device, the sim chip's and a trace's host
copies), so a digest recorded by one is checked on replay by another.

On the CPU a write's checks are made at once, in one pass over its bytes by a compiled kernel
(hardware/fused_checks.py), or by `reference`'s torch operations where the kernel cannot be built or
REWIND_CHECKS=torch asks for them: the two agree bit for bit. The extremes and the mean are of the finite
elements; -0.0 reads as 0.0 (which of two zeros a min keeps depends on the order it reads them in). The sum
behind the mean does not depend on the order of the additions either: each finite element is rounded to a
multiple of 2^-k (k from the largest magnitude, the terms at most 2^50) and the integers are added, so the
mean is the same with any number of threads and either implementation, to about 2^-50 of the largest
magnitude.

On another device (a GPU) three reductions on the tensor's device (digest, min/max, sum) make a `Check`: the
digest's word sum and [min, max, sum] in the sum's dtype, computed without waiting for them, so `pack` makes
no other kernel: each is a launch the host pays for. `TensorReadback` carries a batch of them to the host,
one stacked column each (the torch driver's own readback makes that copy asynchronous on a GPU). NaN and Inf
show in the row (min/max propagate a NaN, an Inf is an extreme), and only a row that shows one (or an
overflowed sum) is looked at closer, from its tensor, to count them and take the stats of the finite
elements. The mean there is torch's float sum, which may differ from the CPU's in the last bits: a kernel of
the CPU's definition for the GPU (Triton) is still to be written.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import torch

from hardware import fused_checks
from hardware.driver import ChecksReadback, WriteStats
from hardware.errors import RewindError
from hardware.fused_checks import Sums

CHECKS_VARIABLE = "REWIND_CHECKS"
CHECKS = {"fused": "one compiled pass over each write's bytes (the default)", "torch": "torch operations"}
_checks: list[str] = []  # how the CPU's checks are made; empty until the first asks


class Check(NamedTuple):
    """One write's checks, on its device: the digest's word sum (int64, 0-d) and [min, max, sum] (1-d)."""

    words: torch.Tensor
    extremes_sum: torch.Tensor


_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def word_sum(flat: torch.Tensor) -> torch.Tensor:
    """The wrapping int64 sum of a 1-d tensor's bytes read as their widest words: one pass, no temporaries."""
    nbytes = flat.numel() * flat.element_size()
    width = min(8, nbytes & -nbytes)  # the widest power of two dividing it
    flat = flat.contiguous()
    if flat.storage_offset() * flat.element_size() % width:  # a view that starts mid-word cannot be viewed as words
        flat = flat.clone()
    return flat.view(_WORDS[width]).sum(dtype=torch.int64)


def _wrap64(n: int) -> int:
    return (n + (1 << 63)) % (1 << 64) - (1 << 63)


def digest_of(words: int, tensor: torch.Tensor) -> int:
    """A checksum of a tensor's bytes from their word sum: any change of one word changes it. It does not see
    a permutation of whole words, which no non-deterministic kernel produces without also changing values."""
    return _wrap64(words + tensor.nbytes)


def _elements(flat: torch.Tensor) -> torch.Tensor:
    """The elements the stats describe: booleans as bytes, complex numbers by magnitude."""
    x = flat.view(torch.uint8) if flat.dtype == torch.bool else flat
    return x.abs() if x.is_complex() else x


def _sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """A narrow float sums in float32, an integer in float64 (a float32 sum in float64 is 20x slower on a CPU)."""
    if dtype.is_floating_point:
        return torch.float32 if dtype.itemsize < 4 else dtype
    return torch.float64


def pack(tensor: torch.Tensor) -> Check | WriteStats | None:
    """The checks of a write: on the CPU its stats, made at once; elsewhere computed on its device without waiting
    for them, None for an empty tensor."""
    if tensor.device.type == "cpu":
        return host_stats(tensor)
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
    if tensor.device.type == "cpu":
        return host_stats(tensor)
    return TensorReadback([pack(tensor)], [tensor]).stats()[0]


# -- on the CPU: one pass -------------------------------------------------------------------------------------
def use_checks(how: str) -> None:
    """Make the CPU's checks with `how` (a key of CHECKS) from now on."""
    if how not in CHECKS:
        raise RewindError(f"the checks are made by {' or '.join(repr(k) for k in CHECKS)}, not {how!r}")
    _checks[:] = [how]


def checks_by() -> str:
    """How the CPU's checks are made: $REWIND_CHECKS, else fused."""
    if not _checks:
        how = os.environ.get(CHECKS_VARIABLE, "fused")
        if how not in CHECKS:
            raise RewindError(f"{CHECKS_VARIABLE} is {how!r}: it is 'fused' ({CHECKS['fused']}) or 'torch' "
                              f"({CHECKS['torch']})")
        _checks[:] = [how]
    return _checks[0]


# Dtypes whose elements torch widens to float64 (the others, packed and bit types, get a digest and no stats).
_VALUED = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
           torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32,
           torch.complex64, torch.complex128, *fused_checks.FLOAT8}


def host_stats(tensor: torch.Tensor) -> WriteStats:
    """The stats of a write on the CPU, in one pass (the fused kernel) or by `reference`. The kernel reads a
    contiguous tensor's memory as it is: no flat view made per write."""
    if tensor.numel() == 0:
        return WriteStats.empty()
    if tensor.dtype not in _VALUED:
        flat = tensor.reshape(-1)
        return WriteStats(digest_of(int(word_sum(flat)), flat), 0, 0, math.nan, math.nan, math.nan)
    kernel = fused_checks.kernel() if checks_by() == "fused" else None
    sums = kernel.sums(tensor.contiguous()) if kernel is not None else None
    return stats_of(sums or reference(tensor), tensor)


_SLICE = 1 << 18  # elements `reference` widens at a time: its temporaries stay small (no page faults)
# Element dtypes float32 holds exactly (the others are widened to float64): v * 2^k is exact in either, or below
# the smallest normal and rounds to 0 either way, so the two agree with the kernel's float64 arithmetic.
_IN_FLOAT32 = {torch.float32, torch.float16, torch.bfloat16, *fused_checks.FLOAT8, torch.uint8, torch.int8,
               torch.int16, torch.uint16}


def reference(tensor: torch.Tensor) -> Sums:
    """The definition of the CPU's checks, in torch operations (of a tensor of a valued dtype, not empty)."""
    flat = tensor.reshape(-1)
    n = flat.numel()
    parts = [slice(at, at + _SLICE) for at in range(0, n, _SLICE)]
    nan = count = 0
    lo, hi = math.inf, -math.inf
    for part in parts:
        p_nan, p_count, p_lo, p_hi = _extremes(_widened(flat[part]))
        nan, count, lo, hi = nan + p_nan, count + p_count, min(lo, p_lo), max(hi, p_hi)
    k = qsum = 0
    largest = max(abs(lo), abs(hi)) if count else 0.0
    if largest > 0:
        k = min(50, 61 - (n - 1).bit_length()) - math.frexp(largest)[1]  # the terms stay <= 2^50
        qsum = sum(_quantised(_widened(flat[part]), k, count < n) for part in parts)
    return Sums(int(word_sum(flat)), nan, count, lo, hi, qsum, k)


_LARGEST_EXPONENT = {torch.float32: 127, torch.float64: 1023}  # of a power of two the dtype holds


def _widened(flat: torch.Tensor) -> torch.Tensor:
    x = _elements(flat)
    return x.float() if x.dtype in _IN_FLOAT32 else x.double()


def _extremes(v: torch.Tensor) -> tuple[int, int, float, float]:
    """NaNs, finite elements, and the smallest and largest finite one (inf, -inf when none)."""
    lo, hi = (float(e) for e in torch.aminmax(v))  # a NaN propagates, an infinity is an extreme
    if math.isfinite(lo) and math.isfinite(hi):
        return 0, v.numel(), lo, hi
    finite = torch.isfinite(v)
    lo, hi = float(torch.where(finite, v, math.inf).amin()), float(torch.where(finite, v, -math.inf).amax())
    return int(torch.isnan(v).sum()), int(finite.sum()), lo, hi


def _quantised(v: torch.Tensor, k: int, nonfinite: bool) -> int:
    """The sum of round_half_even(v * 2^k) over the finite elements: 2^k in two factors where it is beyond v's
    dtype (float32's smallest subnormals, float64's)."""
    x = torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0) if nonfinite else v
    k1 = k if k <= _LARGEST_EXPONENT[v.dtype] else k >> 1
    x = x * math.ldexp(1.0, k1)
    if k1 != k:
        x = x.mul_(math.ldexp(1.0, k - k1))
    return int(x.round_().sum(dtype=torch.int64))


def stats_of(sums: Sums, flat: torch.Tensor) -> WriteStats:
    """WriteStats from one pass's sums: the mean is their exact quotient, rounded once."""
    words, nan, finite, lo, hi, qsum, k = sums
    digest_ = digest_of(words, flat)
    inf = flat.numel() - nan - finite
    if not finite:
        return WriteStats(digest_, nan, inf, math.nan, math.nan, math.nan)
    try:
        mean = qsum / (finite << k) if k >= 0 else (qsum << -k) / finite
    except OverflowError:  # values at the largest float, their sum rounded past it: the mean lies in [lo, hi]
        mean = hi if qsum > 0 else lo
    return WriteStats(digest_, nan, inf, lo + 0.0, hi + 0.0, mean)


class TensorReadback(ChecksReadback):
    """A batch of Checks read back to the host: each column stacked (one kernel each) and read when asked (the
    CPU's checks were made at once: they pass through)."""

    def __init__(self, checks: list[Check | WriteStats | None], tensors: list[Any]):
        self._checks, self._tensors = checks, tensors
        packed = [c for c in checks if isinstance(c, Check)]
        # stack promotes: a batch mixing float32 and float64 rows reads back as float64
        self._columns = [torch.stack(column) for column in zip(*packed)]

    def ready(self) -> bool:
        return True

    def stats(self) -> list[WriteStats]:
        rows = zip(*(column.tolist() for column in self._columns))
        return [check if isinstance(check, WriteStats) else WriteStats.empty() if check is None
                else stats(*next(rows), tensor) for check, tensor in zip(self._checks, self._tensors)]
