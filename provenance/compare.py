"""Comparing one value of a pass with the reference's, under dtype-aware tolerances.

An element mismatches when |a - b| > atol + rtol * max(|b|, scale), where b is the reference
and scale is the root mean square of the reference value, or the magnitude of the terms it was
computed from where that is more (provenance/magnitudes.py): an element near zero in a tensor
of large numbers is judged against the tensor's magnitude, not its own, and a sum that cancels
against its terms' (a rounding error of a few ulps of them is not a divergence). NaN matches NaN and an infinity matches the
same infinity: both passes agree there. `error` is the worst element's |a - b| in units of
its tolerance, so a value is within tolerance exactly when error <= 1. A NaN this pass has where the
reference has none is a mismatch (its error is infinite). The cosine is of two vectors of numbers: it
is undefined (None, with its reason) when either side holds NaN/Inf.

A value is judged at a precision no stricter than what the user compiles for (`judged_precision`):
the program's outputs at the less precise of their declared dtype and the compute precision (the
least precise floating dtype among the parameters and floating inputs), whatever dtypes the data
went through on the way; a value inside the program at the less precise of that compute precision
and the data it carries (a float32 value computed from float16 values is no more accurate than
float16). So a fix that runs a float16 model's reduction in float32 is judged as the model is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hardware.errors import RewindError
from hardware.jsonable import json_safe
from hardware.program import Program

# (rtol, atol) per dtype against a float64 reference: rtol is a handful of ulps for one op's
# rounding with room for the slow growth of rounding error through a deep model; atol is the
# smallest normal number, since the scale already keeps near-zero elements from mattering.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, torch.finfo(torch.float64).tiny),
    "float32": (1e-4, torch.finfo(torch.float32).tiny),
    "float16": (5e-3, torch.finfo(torch.float16).tiny),
    "bfloat16": (4e-2, torch.finfo(torch.bfloat16).tiny),
}


@dataclass(frozen=True)
class Tolerance:
    """User overrides; None keeps the dtype's default."""

    rtol: float | None = None
    atol: float | None = None

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise RewindError(f"{name} must be a finite number >= 0, got {v}")

    def for_dtype(self, dtype: str) -> tuple[float, float]:
        rtol, atol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))  # integers and booleans compare exactly
        return (rtol if self.rtol is None else self.rtol, atol if self.atol is None else self.atol)


@dataclass(frozen=True)
class Comparison:
    value: str
    dtype: str
    rtol: float
    atol: float
    numel: int
    max_abs: float
    max_rel: float
    rmse: float
    cosine: float | None  # None when either side holds NaN/Inf (COSINE_UNDEFINED)
    mismatches: int
    first_mismatch: tuple[int, ...] | None
    error: float  # the worst element's |a - b| over its tolerance: <= 1 is within tolerance
    nonfinite: int = 0  # NaN/Inf elements in this pass (where the reference has them too, they match)
    reference_nonfinite: int = 0  # NaN/Inf elements in the reference

    @property
    def within(self) -> bool:
        return self.mismatches == 0

    def to_dict(self) -> dict:
        """JSON: `nonfinite` counts this pass's NaN/Inf elements, `referenceNonfinite` the reference's."""
        out = {"value": self.value, "dtype": self.dtype, "rtol": self.rtol, "atol": self.atol, "maxAbs": self.max_abs,
               "maxRel": self.max_rel, "rmse": self.rmse, "cosine": self.cosine, "mismatches": self.mismatches,
               "firstMismatch": self.first_mismatch, "error": self.error, "nonfinite": self.nonfinite,
               "referenceNonfinite": self.reference_nonfinite, "within": self.within}
        if self.cosine is None:
            out["cosineReason"] = COSINE_UNDEFINED
        if self.first_mismatch is None:
            out["firstMismatchReason"] = "no element is beyond tolerance"
        return json_safe(out)


COSINE_UNDEFINED = "this pass or the reference holds NaN/Inf: the cosine of the two is undefined"


def carried_precision(program: Program) -> dict[str, str]:
    """Value -> the least precise floating dtype its data went through (its own dtype when not floating)."""
    out: dict[str, str] = {}
    for name, info in program.values.items():
        if info.producer is None or info.dtype not in DEFAULT_TOLERANCES:
            out[name] = info.dtype
    for node in program.nodes:
        carried = [out[n] for n in node.input_names() if out[n] in DEFAULT_TOLERANCES]
        for name in node.outputs:
            own = program.values[name].dtype
            out[name] = max([own] + carried, key=_eps) if own in DEFAULT_TOLERANCES else own
    return out


def abs_tolerance(ref: torch.Tensor, rtol: float, atol: float) -> float:
    """The smallest absolute difference `compare` counts as beyond tolerance anywhere in `ref`: what a value is
    sensitive to, in its own units (an element near zero is judged against the value's root mean square)."""
    finite = ref.detach().double().reshape(-1)
    finite = finite[torch.isfinite(finite)]
    return atol + rtol * (float(finite.square().mean().sqrt()) if finite.numel() else 0.0)


def judged_precision(program: Program) -> dict[str, str]:
    """Value -> the dtype whose tolerance it is judged at (see the module's docstring)."""
    carried, compute = carried_precision(program), compute_precision(program)
    return {name: max(dtype, compute or dtype, key=_eps) if dtype in DEFAULT_TOLERANCES else dtype
            for name, dtype in carried.items()}


def compute_precision(program: Program) -> str | None:
    """The least precise floating dtype among the parameters and floating inputs: what the user compiles for
    (None when there are none)."""
    dtypes = [v.dtype for v in program.values.values() if v.kind in ("parameter", "input") and v.dtype in
              DEFAULT_TOLERANCES]
    return max(dtypes, key=_eps) if dtypes else None


def _eps(dtype: str) -> float:
    return torch.finfo(getattr(torch, dtype)).eps


def compare(value: str, dtype: str, test: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float,
            scale: float = 0.0) -> Comparison:
    """Compare host tensors `test` and `ref` (any dtypes; measured in float64) as value `value` of `dtype`; `scale`:
    the magnitude the value was computed from (provenance/magnitudes.py), when it is more than the value's own."""
    a, b = _flat(value, test, ref)
    deviation = _deviation(a, b, rtol, atol, scale)
    fields = _fields(a, b, rtol, atol, scale) if deviation is None else _finite_fields(a, b, *deviation)
    bad_at = fields.pop("first")
    first = tuple(int(i) for i in torch.unravel_index(bad_at, tuple(test.shape))) if bad_at is not None else None
    return Comparison(value, dtype, rtol, atol, a.numel(), first_mismatch=first, **fields)


def error(value: str, test: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float,
          scale: float = 0.0) -> tuple[float, float]:
    """(error, max_abs) of `test` against `ref`, as `compare` measures them, without the other measures: a
    value's error from fewer passes over its data."""
    a, b = _flat(value, test, ref)
    deviation = _deviation(a, b, rtol, atol, scale)
    if deviation is None:
        c = compare(value, "", test, ref, rtol, atol, scale)
        return c.error, c.max_abs
    diff, bound, _ = deviation
    return _finite_error(diff, bound), float(diff.max()) if diff.numel() else 0.0


def _flat(value: str, test: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if tuple(test.shape) != tuple(ref.shape):
        raise RewindError(f"'{value}' has shape {list(test.shape)} in this pass but {list(ref.shape)} in the reference")
    return test.detach().to(torch.float64).reshape(-1), ref.detach().to(torch.float64).reshape(-1)


Deviation = tuple[torch.Tensor, torch.Tensor, bool]  # |a - b|, each element's bound, every element finite


def _deviation(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, floor: float) -> Deviation | None:
    """|a - b|, each element's bound and whether all is finite, unless a NaN or an infinity the other does not
    have makes the fast measures wrong (then None). A finite sum of the differences says none does;
    infinities both have in the same places (an attention mask's -inf) are no difference."""
    diff = a - b
    if not math.isfinite(float(diff.sum())):
        diff = torch.where(a == b, 0.0, diff)
        if not math.isfinite(float(diff.sum())):
            return None
    finite = torch.isfinite(b)
    everywhere = bool(finite.all())
    kept = b if everywhere else b[finite]
    scale = max(float(kept.square().mean().sqrt()) if kept.numel() else 0.0, floor)
    bound = torch.maximum(b.abs(), torch.tensor(scale, dtype=torch.float64)).mul_(rtol).add_(atol)
    return diff.abs_(), bound, everywhere


def _fields(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, floor: float) -> dict:
    """The comparison's measures where NaN and infinities may occur."""
    agree = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(agree, 0.0, (a - b).abs().nan_to_num(nan=math.inf, posinf=math.inf))
    finite = b[torch.isfinite(b)]
    scale = max(float(finite.square().mean().sqrt()) if finite.numel() else 0.0, floor)
    bound = atol + rtol * torch.maximum(b.abs(), torch.tensor(scale, dtype=torch.float64))
    bad = (diff > bound) | torch.isinf(diff)  # an infinite difference exceeds even an infinite bound
    bad_at = bad.nonzero().reshape(-1)
    return {"max_abs": float(diff.max()) if diff.numel() else 0.0, "max_rel": _max_rel(diff, b),
            "rmse": float(diff.square().mean().sqrt()) if diff.numel() else 0.0, "cosine": None,
            "mismatches": int(bad_at.numel()), "first": bad_at[0] if bad_at.numel() else None,
            "error": _error(diff, bound, bad), "nonfinite": int((~torch.isfinite(a)).sum()),
            "reference_nonfinite": int((~torch.isfinite(b)).sum())}


def _finite_fields(a: torch.Tensor, b: torch.Tensor, diff: torch.Tensor, bound: torch.Tensor, finite: bool) -> dict:
    """The same measures from a `_deviation`, in a third of the passes over the data: no NaN to agree on."""
    if not a.numel():
        return {"max_abs": 0.0, "max_rel": 0.0, "rmse": 0.0, "cosine": 1.0, "mismatches": 0,
                "first": None, "error": 0.0, "nonfinite": 0, "reference_nonfinite": 0}
    bad = diff > bound
    mismatches = int(bad.sum())
    max_abs = float(diff.max())
    nonfinite = 0 if finite else int((~torch.isfinite(a)).sum())
    reference_nonfinite = 0 if finite else int((~torch.isfinite(b)).sum())
    return {"max_abs": max_abs,
            "max_rel": float((diff / b.abs()).nan_to_num_(nan=0.0, posinf=math.inf).max()) if max_abs else 0.0,
            "rmse": float(diff.square().mean().sqrt()), "mismatches": mismatches,
            "cosine": _cosine(a, b) if finite else None,
            "first": bad.view(torch.uint8).argmax() if mismatches else None,
            "error": _finite_error(diff, bound), "nonfinite": nonfinite, "reference_nonfinite": reference_nonfinite}


def _finite_error(diff: torch.Tensor, bound: torch.Tensor) -> float:
    if not diff.numel():
        return 0.0
    if float(bound.min()) >= _TINY_BOUND:
        return float((diff / bound).max())
    return _error(diff, bound, diff > bound)


_TINY_BOUND = 1e-300  # below it `_error` divides by this instead of the bound

def _max_rel(diff: torch.Tensor, b: torch.Tensor) -> float:
    if not diff.numel() or not bool((diff > 0).any()):
        return 0.0
    return float(torch.where(diff == 0, 0.0, diff / b.abs()).nan_to_num(nan=math.inf, posinf=math.inf).max())


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The cosine of two finite vectors."""
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return max(-1.0, min(1.0, float(torch.dot(a, b)) / (na * nb)))


def _error(diff: torch.Tensor, bound: torch.Tensor, bad: torch.Tensor) -> float:
    if not diff.numel():
        return 0.0
    if bool((bad & ((bound == 0) | torch.isinf(diff))).any()):
        return math.inf
    return float((diff / bound.clamp_min(_TINY_BOUND)).nan_to_num(nan=0.0, posinf=math.inf).max())
