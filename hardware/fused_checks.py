"""The checks of a write in one call on the CPU, its bytes read once from memory: a small C++ kernel
(fused_checks.cpp, beside this file) that computes what `tensor_checks.reference` computes with a dozen torch
operations, bit for bit.

The kernel is built the first time a process needs it, with the system's C++ compiler ($CXX, else g++ or c++;
two to three seconds), for this CPU, and kept in the user's cache ($XDG_CACHE_HOME or ~/.cache, under
rewind/kernels/), named by a hash of its source, the flags and the CPU, so every later process loads it in a
millisecond and an edited source or another machine builds its own. Two processes building at once each write a
private file and rename it into place; a cached file that does not load is built again. It has no Python or
torch headers to compile against: it is a plain C function called through ctypes with the tensor's address
(ctypes lets go of the GIL while it runs). Where it cannot be built or loaded (no compiler, no writable cache),
`kernel()` says why in one line on stderr, once, and answers None: the checks run as torch operations.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

import torch

SOURCE = Path(__file__).with_name("fused_checks.cpp")
BUILD_SECONDS = 120  # a compiler slower than this is stuck

# The kernel's element kinds (its `enum Kind`); a one-byte float is decoded through a table of 256 floats.
_KINDS = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int8: 5, torch.uint8: 6,
          torch.bool: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.uint16: 10, torch.uint32: 11,
          torch.uint64: 12}
_LUT8 = 4
FLOAT8 = [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                             "float8_e8m0fnu") if hasattr(torch, name)]


class Sums(NamedTuple):
    """What one pass over a write gives (tensor_checks.reference's definition, which the kernel follows)."""

    words: int  # the wrapping int64 sum of its bytes as their widest words
    nan: int
    finite: int  # the others are infinities
    lo: float  # the smallest finite element (inf when none is finite)
    hi: float  # the largest (-inf when none)
    qsum: int  # sum of round_half_even(v * 2^k) over the finite elements v
    k: int


class Kernel:
    """The loaded kernel: `sums(dense)` for a contiguous CPU tensor of a dtype it decodes (its elements in order from
    its first), else None."""

    def __init__(self, library: ctypes.CDLL):
        self._fn = library.rewind_checks
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p]
        self._tables = {dtype: torch.arange(256, dtype=torch.uint8).view(dtype).float() for dtype in FLOAT8}
        self._out = _Out()

    def sums(self, dense: torch.Tensor) -> Sums | None:
        kind, table = _KINDS.get(dense.dtype), None
        if kind is None:
            table = self._tables.get(dense.dtype)
            if table is None:
                return None
            kind, table = _LUT8, table.data_ptr()
        out = self._out  # this thread's: sessions may run in threads
        self._fn(dense.data_ptr(), dense.numel(), kind, table, out.at, out.at + _DOUBLES_AT)
        words, nan, finite, qsum, k, lo, hi = _read_out(out.words)
        return Sums(words, nan, finite, lo, hi, qsum, k)


class _Out(threading.local):
    """Where the kernel writes one call's results, made once per thread (not per write): its five integers, then
    its two doubles, read back in one unpacking."""

    def __init__(self) -> None:
        self.words = (ctypes.c_int64 * 7)()
        self.at = ctypes.addressof(self.words)


_DOUBLES_AT = 5 * 8  # bytes
_read_out = struct.Struct("=5q2d").unpack_from


_lock = threading.Lock()
_loaded: list[Kernel | None] = []  # empty until the first call of kernel()


def kernel() -> Kernel | None:
    """The kernel, built or loaded on the first call; None (said once, on stderr) where it cannot be."""
    if _loaded:  # every call but the first: no lock
        return _loaded[0]
    with _lock:
        if not _loaded:
            try:
                _loaded.append(Kernel(_library()))
            except (OSError, subprocess.SubprocessError, _BuildFailed) as e:
                _loaded.append(None)
                print(f"rewind: the fused checks could not be built ({e}); each write's checks run as torch "
                      "operations", file=sys.stderr)
        return _loaded[0]


class _BuildFailed(Exception):
    pass


def _library() -> ctypes.CDLL:
    path = _built()
    try:
        return ctypes.CDLL(str(path))
    except OSError:  # a damaged cache entry (a disk that filled up, a copy cut short): built again
        path.unlink(missing_ok=True)
        return ctypes.CDLL(str(_built()))


def _flags() -> list[str]:
    flags = ["-O3", "-std=c++17", "-shared", "-fPIC"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        flags += ["-march=native", "-mprefer-vector-width=512"]  # the widest vectors this CPU has
    return flags


def _cpu() -> str:
    """What the built kernel depends on of this CPU (it is built for it: -march=native)."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        info = []
    return "|".join([platform.machine(), platform.processor()]
                    + [line for line in info if line.startswith(("flags", "model name", "Features"))][:2])


def _compiler() -> str:
    found = shutil.which(os.environ.get("CXX") or "g++") or shutil.which("c++")
    if found is None:
        raise _BuildFailed(f"no C++ compiler: {os.environ.get('CXX') or 'g++'} is not on the PATH")
    return found


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rewind" / "kernels"


def _built() -> Path:
    """The kernel's shared library, built into the cache unless a build of the same source, flags and CPU is
    there."""
    source, flags = SOURCE.read_bytes(), _flags()
    key = hashlib.sha256(source + repr(flags).encode() + _cpu().encode()).hexdigest()[:16]
    target = _cache_dir() / f"fused_checks-{key}.so"
    if target.exists():
        return target
    compiler = _compiler()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise _BuildFailed(f"the cache folder {target.parent} is not writable: {e.strerror}") from e
    os.close(fd)
    try:
        run = subprocess.run([compiler, *flags, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                             timeout=BUILD_SECONDS)
        if run.returncode != 0:
            lines = run.stderr.strip().splitlines() or ["no message"]
            said = next((line for line in lines if "error" in line), lines[0])
            raise _BuildFailed(f"{Path(compiler).name} failed: {said}")
        os.replace(tmp, target)  # atomic: a process building the same key at once renames an equal file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
