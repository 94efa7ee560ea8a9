"""Which lanes of each value a masked-off load's `other` (or an out-of-bounds lane) decided.

A masked load marks the lanes it did not read. The mark flows through elementwise ops, selects, layout
ops and reductions, but only where the marked value changed the result: a reduction counts a marked lane
that is not its identity (a sum's 0, a max's lane that is not the maximum), a dot a marked lane with a
nonzero partner. A store that writes a marked lane is a masked-off lane's `other` reaching an output
(`other=0.0` where a max needed -inf, padding lanes summed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

KEY = "rewind.padding"


def of(handle: Any) -> np.ndarray | None:
    attr = getattr(handle, "attr", None)
    return attr.get(KEY) if isinstance(attr, dict) else None


def mark(handle: Any, lanes: np.ndarray | None) -> None:
    if lanes is not None and lanes.any():
        handle.attr[KEY] = np.broadcast_to(lanes, np.shape(handle.data)).copy()


def lanes(handle: Any) -> np.ndarray:
    found = of(handle)
    return np.zeros(np.shape(handle.data), bool) if found is None else found


def propagate(op: str, args: tuple, result: Any) -> None:
    """Mark `result` of builder op `op` from the marks of its arguments."""
    if not any(of(a) is not None for a in args) or not hasattr(result, "data"):
        return  # most operations: no argument carries a mark
    inputs = [a for a in args if hasattr(a, "data") and hasattr(a, "attr")]
    shape = np.shape(result.data)
    if op == "create_select":
        cond, a, b = args[0], args[1], args[2]
        marks = np.where(cond.data, lanes(a), lanes(b)) | lanes(cond)
    elif op == "create_dot":
        marks = _dot(args[0], args[1]) | np.broadcast_to(lanes(args[2]), shape)
    elif op == "create_expand_dims":
        marks = np.expand_dims(lanes(args[0]), args[1])
    elif op == "create_trans":
        marks = np.transpose(lanes(args[0]), args[1])
    elif op == "create_reshape":
        marks = lanes(args[0]).reshape(shape)
    else:
        marks = _elementwise(inputs, shape)
    mark(result, marks)


def _elementwise(inputs: list, shape: tuple) -> np.ndarray:
    try:
        out = np.zeros(shape, bool)
        for a in inputs:
            out |= np.broadcast_to(lanes(a), shape)
        return out
    except ValueError:  # an op whose result is not its operands' shape: every lane may be decided by padding
        return np.ones(shape, bool) if any(lanes(a).any() for a in inputs) else np.zeros(shape, bool)


def _dot(a: Any, b: Any) -> np.ndarray:
    """A marked lane changes a product's sum when its partner is nonzero."""
    live_a, live_b = (a.data != 0), (b.data != 0)
    left = (lanes(a) & live_a).astype(np.float32) @ live_b.astype(np.float32)
    right = live_a.astype(np.float32) @ (lanes(b) & live_b).astype(np.float32)
    return (left + right) > 0


def reduce(combine: Any, source: Any, result: Any, axis: int | None, keep_dims: bool) -> bool:
    """Mark a reduction's result: lanes that are not the reduction's identity contributed (a sum's 0, a max's
    lane that is not the maximum); a reduction of another combine function counts every marked lane. Returns
    whether a marked lane counted."""
    marked = of(source)
    if marked is None or not hasattr(result, "data"):
        return False
    data, kind = source.data, getattr(getattr(combine, "fn", combine), "__name__", "")
    if "sum" in kind:
        counted = marked & (data != 0)
    elif "max" in kind or "min" in kind:
        pick = np.nanmax if "max" in kind else np.nanmin
        best = pick(data, axis=axis, keepdims=True)
        counted = marked & (data == best)
    else:
        counted = marked
    out = counted.any(axis=axis, keepdims=keep_dims) if axis is not None else np.array(counted.any())
    mark(result, np.asarray(out).reshape(np.shape(result.data)))
    return bool(counted.any())
