"""What a core's compute instructions do to tiles, in numpy.

Floating-point arithmetic runs in float32 (float64 when an operand is float64) and the result is
rounded once to the destination tile's dtype, round-to-nearest-even (ml_dtypes), as an NPU's
vector unit with a wide accumulator does. fp8 e4m3fn has no infinity: converting to it
saturates to +-448, as torch does.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)
_E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)


def wide(*arrays: np.ndarray) -> np.dtype:
    """The dtype arithmetic runs in for these operands."""
    kinds = [a.dtype for a in arrays if isinstance(a, np.ndarray)]
    if any(k == np.float64 for k in kinds):
        return np.dtype(np.float64)
    if all(k.kind in "biu" for k in kinds) and kinds:
        return np.dtype(np.int64) if any(k.kind in "iu" for k in kinds) else np.dtype(bool)
    return np.dtype(np.float32)


def operand(x, dtype: np.dtype):
    return x.astype(dtype, copy=False) if isinstance(x, np.ndarray) else dtype.type(x)


def store(dst: np.ndarray, result) -> None:
    """Round `result` once into the destination tile's dtype."""
    result = np.asarray(result)
    if dst.dtype == ml_dtypes.float8_e4m3fn:
        result = np.clip(result, -_E4M3_MAX, _E4M3_MAX)
    dst[...] = result.astype(dst.dtype) if result.dtype != dst.dtype else result


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY = {
    "relu": lambda x: np.maximum(x, x.dtype.type(0)),
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "silu": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "neg": np.negative,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sqrt": np.sqrt,
    "abs": np.abs,
    "not": lambda x: ~x if x.dtype == bool else np.logical_not(x),
    "copy": lambda x: x,
}

BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum,
    "min": np.minimum, "pow": np.power, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or,
}

REDUCE = {"sum": np.sum, "max": np.max}


def unary(op: str, dst: np.ndarray, x: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        store(dst, UNARY[op](operand(x, wide(x) if x.dtype != bool else x.dtype)))


def binary(op: str, dst: np.ndarray, a, b) -> None:
    dtype = wide(a, b)
    with np.errstate(all="ignore"):
        store(dst, BINARY[op](operand(a, dtype), operand(b, dtype)))


def reduce(op: str, dst: np.ndarray, x: np.ndarray) -> None:
    """Reduce along the tile's last axis (dst is [rows, 1])."""
    with np.errstate(all="ignore"):
        store(dst, REDUCE[op](operand(x, wide(x)), axis=-1, keepdims=True))


def select(dst: np.ndarray, cond: np.ndarray, a, b) -> None:
    dtype = wide(a, b) if dst.dtype.kind == "f" else dst.dtype
    store(dst, np.where(cond.astype(bool), operand(a, dtype), operand(b, dtype)))


def matmul(dst: np.ndarray, a: np.ndarray, b: np.ndarray, accumulate: bool) -> None:
    dtype = wide(a, b)
    product = np.matmul(operand(a, dtype), operand(b, dtype))
    store(dst, product + operand(dst, dtype) if accumulate else product)


def triangle(dst: np.ndarray, x: np.ndarray, diagonal: int, row0: int, col0: int, rows: int, upper: bool) -> None:
    """Keep x where column - row <= diagonal (tril) or >= diagonal (triu), else 0. Tile element (i, j) is
    matrix element ((row0 + i) % rows, col0 + j)."""
    r = (row0 + np.arange(x.shape[0]))[:, None] % rows
    c = col0 + np.arange(x.shape[-1])[None, :]
    keep = (c - r >= diagonal) if upper else (c - r <= diagonal)
    store(dst, np.where(keep, x, np.zeros((), dtype=x.dtype)))
