"""A knowledge base of numerical failure patterns: each a rule over the evidence with a suggested fix.

A rule looks at one node's evidence (its op, dtypes, operand values, and the shape of its
error against the reference) and returns the reason it matches, in words, or None; or a
(reason, fix) pair when the case has a better fix than the pattern's general one (log of a
softmax: log_softmax). Rules are tried in the order they are registered; the first that
matches names the finding. Add a pattern with the `@pattern(...)` decorator, here or from any
module imported before use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from hardware.program import Node, Program
from provenance.compare import Comparison

LOW_PRECISION = ("float16", "bfloat16")
# How much larger the operands of an addition must be than its result for the rounding of
# the operands to dominate the result: catastrophic cancellation.
CANCELLATION_RATIO = 64.0
# An accumulation is a loop: at least this many nodes of the same op at the same source line.
ACCUMULATION_CHAIN = 4


@dataclass
class Evidence:
    """What the rules see about one node that went wrong."""

    kind: str  # "nonfinite": it wrote NaN/Inf its inputs did not carry; "divergence": it left the reference
    node: Node
    dtype: str  # of the output in question
    inputs: dict[str, torch.Tensor]  # the node's operands in this pass (host tensors), in argument order
    output: torch.Tensor  # the output in question, in this pass
    observed: Comparison | None = None  # the output against the reference
    introduced: Comparison | None = None  # the node rerun on the reference's inputs, against the reference
    chain: int = 1  # nodes of this op at this source line in a row, feeding each other, ending here
    producers: dict[str, str] = field(default_factory=dict)  # operand -> the op that wrote it (aten.softmax)
    program: Program | None = None  # the whole Program, for the rules of a training step (its forward, its steps)
    recorded: Callable[[str], torch.Tensor] | None = None  # any value as this pass wrote it (a parameter: its start)
    reference: Callable[[str], torch.Tensor] | None = None  # any value in the reference (None: none asked for)

    @property
    def op(self) -> str:
        return self.node.op_short

    @property
    def accumulated(self) -> bool:
        """The error crossed tolerance here though this node introduced little of it."""
        return self.kind == "divergence" and self.introduced is not None and self.introduced.within

    def operands(self) -> list[torch.Tensor]:
        """The floating-point tensor operands, and the numbers written into the op's arguments."""
        numbers = [a for a in self.node.args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        return [t for t in self.inputs.values() if t.is_floating_point()] + [torch.tensor(float(n)) for n in numbers]

    def dim(self) -> int:
        return self.node.args[1] if len(self.node.args) > 1 else self.node.kwargs.get("dim", -1)


@dataclass(frozen=True)
class Pattern:
    name: str
    title: str
    fix: str
    rule: Callable[[Evidence], "Because | None"]
    training: bool = False  # a failure of a training step (a gradient, an update): tried first in one


Because = str | tuple[str, str]  # why a rule matches, or (why, the fix that fits this case best)


@dataclass(frozen=True)
class Match:
    pattern: Pattern
    reason: str
    case_fix: str | None = None  # a fix for this case that comes before the pattern's general one

    @property
    def fix(self) -> str:
        return self.case_fix or self.pattern.fix

    def to_dict(self) -> dict:
        return {"pattern": self.pattern.name, "title": self.pattern.title, "reason": self.reason, "fix": self.fix}


PATTERNS: list[Pattern] = []


def pattern(name: str, title: str, fix: str, training: bool = False):
    """Register the decorated rule as a failure pattern (`training`: of a training step, tried before the others
    there: a NaN in the backward of a log is a gradient's failure before it is a division by zero)."""

    def register(rule: Callable[[Evidence], Because | None]) -> Callable[[Evidence], Because | None]:
        if any(p.name == name for p in PATTERNS):
            raise ValueError(f"failure pattern '{name}' is registered twice")
        PATTERNS.append(Pattern(name, title, fix, rule, training))
        return rule

    return register


def classify(evidence: Evidence) -> Match | None:
    training = evidence.program is not None and bool(evidence.program.step_starts)
    for p in sorted(PATTERNS, key=lambda p: not p.training) if training else PATTERNS:
        if p.training and not training:
            continue
        because = p.rule(evidence)
        if because:
            return Match(p, because) if isinstance(because, str) else Match(p, *because)
    return None


def times(ratio: float) -> str:
    """A ratio in words a person reads at once: "261x", "more than 1e6x", "infinitely" (never "infx")."""
    if math.isnan(ratio):
        return "by an unknown factor"
    if math.isinf(ratio):
        return "infinitely"
    if ratio > 1e6:
        return "more than 1e6x"
    return f"{ratio:.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


# -- the patterns, most specific first ------------------------------------------------------------------

_SOFTMAX_OPS = ("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax")


@pattern("fully-masked-softmax-row", "a softmax row with every element masked",
         "keep at least one position unmasked in every row, or mask with a large finite negative "
         "(torch.finfo(dtype).min) and zero the rows that are fully masked after the softmax")
def _fully_masked_row(ev: Evidence) -> str | None:
    if ev.op not in _SOFTMAX_OPS or not ev.output.isnan().any():
        return None
    scores = next(iter(ev.inputs.values()))
    dim = ev.dim()
    masked = (scores == -math.inf).all(dim=dim)
    if not masked.any():
        return None
    return (f"{int(masked.sum())} row(s) of '{next(iter(ev.inputs))}' along dim {dim} are -inf in every element: "
            "softmax of such a row is 0/0 = NaN")


_EXP_OPS = ("aten.exp", "aten.exp2")


@pattern("exp-overflow", "exp/softmax overflow without max subtraction",
         "subtract the row max before exponentiating (x - x.amax(dim, keepdim=True)), or use torch.softmax / "
         "torch.logsumexp, which do")
def _exp_overflow(ev: Evidence) -> str | None:
    if ev.op not in _EXP_OPS or not ev.output.isinf().any():
        return None
    x = ev.operands()[0]
    limit = math.log(torch.finfo(ev.output.dtype).max) / (math.log(2.0) if ev.op == "aten.exp2" else 1.0)
    top = float(x[torch.isfinite(x)].max()) if torch.isfinite(x).any() else math.nan
    if not top > limit:
        return None
    return (f"the largest exponent is {top:.4g} but exp overflows {ev.dtype} above {limit:.4g}: "
            f"{int(ev.output.isinf().sum())} element(s) became Inf")


def _divisor(ev: Evidence) -> tuple[str, torch.Tensor] | None:
    args = ev.node.args
    if ev.op in ("aten.rsqrt", "aten.reciprocal"):
        name = next(iter(ev.inputs))
        return name, ev.inputs[name]
    if ev.op == "aten.div" and len(args) > 1:
        name = getattr(args[1], "name", None)
        return (name, ev.inputs[name]) if name is not None else ("the divisor", torch.tensor(float(args[1])))
    return None


@pattern("division-by-zero", "division or rsqrt by zero (missing epsilon)",
         "add an epsilon where the divisor can vanish: torch.rsqrt(var + eps), x / (norm + eps) or "
         "x / d.clamp_min(eps)")
def _division_by_zero(ev: Evidence) -> str | None:
    found = _divisor(ev)
    if found is None:
        return None
    name, d = found
    if (d < 0).any() and ev.op == "aten.rsqrt":
        return None  # a negative under the root is a domain error
    zeros = int((d == 0).sum())
    if not zeros or torch.isfinite(ev.output).all():
        return None
    return f"'{name}' has {zeros} zero element(s), so the {ev.op.removeprefix('aten.')} is infinite or NaN there"


_DOMAIN = {"aten.log": 0.0, "aten.log2": 0.0, "aten.log10": 0.0, "aten.sqrt": 0.0, "aten.rsqrt": 0.0,
           "aten.log1p": -1.0}


@pattern("outside-domain", "log or sqrt outside the domain",
         "keep the argument inside the domain: clamp it (x.clamp_min(eps)), or compute the quantity in a form "
         "that cannot leave it: log1p, logsigmoid, log_softmax, torch.var instead of E[x^2] - E[x]^2")
def _outside_domain(ev: Evidence) -> str | None:
    low = _DOMAIN.get(ev.op)
    if low is None or torch.isfinite(ev.output).all():
        return None
    x = ev.operands()[0]
    name = next(iter(ev.inputs))
    fn = ev.op.removeprefix("aten.")
    below = int((x < low).sum())
    if below:
        return f"'{name}' has {below} element(s) below {low:g} (min {float(x.min()):.3g}): {fn} is NaN there"
    at_edge = int((x == low).sum())
    if at_edge and fn.startswith("log"):
        reason = f"'{name}' has {at_edge} element(s) equal to {low:g}: {fn} is -Inf there"
        if ev.op == "aten.log" and ev.producers.get(name) in _SOFTMAX_OPS[:2]:
            return (f"{reason}, where the softmax underflowed to 0", LOG_SOFTMAX_FIX)
        return reason
    return None


LOG_SOFTMAX_FIX = ("compute log(softmax(x)) as torch.log_softmax(x, dim) (F.log_softmax): it never takes the log of "
                   "an underflowed 0; clamping the softmax (clamp_min(eps)) only hides the lost values")


_CANCELLING_OPS = ("aten.sub", "aten.rsub", "aten.add")


@pattern("catastrophic-cancellation", "catastrophic cancellation",
         "avoid subtracting nearly equal quantities: reformulate (1 - cos(x) -> 2 * sin(x / 2) ** 2, "
         "E[x^2] - E[x]^2 -> torch.var, log(1 - p) -> log1p(-p)), or compute the operands and the difference "
         "in higher precision")
def _cancellation(ev: Evidence) -> str | None:
    if ev.op not in _CANCELLING_OPS or ev.introduced is None or ev.introduced.within:
        return None
    operands = [t for t in ev.operands() if t.numel()]
    out = ev.output[torch.isfinite(ev.output)].double()
    if not operands or not out.numel():
        return None
    big = max(float(t.double().abs().max()) for t in operands)
    result = float(out.square().mean().sqrt())
    if big < CANCELLATION_RATIO * result:
        return None
    smaller = "nothing" if result == 0 else f"about {result:.3g} ({times(big / result)} smaller)"
    return f"operands up to {big:.4g} cancel to {smaller}: what is left is mostly the operands' rounding error"


_ACCUMULATING_OPS = ("aten.add", "aten.sum", "aten.mean", "aten.cumsum", "aten.mm", "aten.bmm", "aten.matmul",
                     "aten.addmm", "aten.linear", "aten.index_add", "aten.scatter_add")


@pattern("low-precision-accumulation", "low-precision accumulation in a reduction",
         "accumulate in float32: start the running total as float32 (torch.zeros(..., dtype=torch.float32)) or "
         "reduce with x.sum(dtype=torch.float32), and cast to the low precision once, at the end")
def _low_precision_accumulation(ev: Evidence) -> str | None:
    if ev.op not in _ACCUMULATING_OPS or ev.dtype not in LOW_PRECISION or ev.kind != "divergence":
        return None
    if ev.accumulated and ev.chain >= ACCUMULATION_CHAIN:
        return (f"{ev.chain} {ev.op.removeprefix('aten.')}s in a row at this line each round the running total to "
                f"{ev.dtype}; none is far off alone, together they put it {times(ev.observed.error)} its tolerance "
                "away from the reference")
    if ev.op != "aten.add" and ev.introduced is not None and not ev.introduced.within:
        return (f"this reduction rounds in {ev.dtype}: it alone puts its result {times(ev.introduced.error)} its "
                "tolerance away from the reference")
    return None


_COUNTING_OPS = ("aten.arange", "aten.cumsum")


@pattern("inexact-integers", "integers counted beyond the dtype's exact range",
         "count positions and indices in int64 or float32 (torch.arange(n, dtype=torch.float32)) and cast to the low "
         "precision only after the arithmetic that needs them exact (cos/sin of angles, gathers, masks)")
def _inexact_integers(ev: Evidence) -> str | None:
    if ev.op not in _COUNTING_OPS or not ev.output.is_floating_point():
        return None
    exact = 2.0 / torch.finfo(ev.output.dtype).eps  # every integer up to 2 ** (mantissa bits + 1)
    top = float(ev.output.double().abs().max()) if ev.output.numel() else 0.0
    if top <= exact:
        return None
    beyond = int((ev.output.double().abs() > exact).sum())
    off = float(_spacing(torch.tensor(top, dtype=torch.float64), ev.output.dtype)) / 2
    return (f"{ev.dtype} holds every integer only up to {exact:.0f}; this {ev.op.removeprefix('aten.')} counts to "
            f"about {top:.0f}, so {beyond} of its {ev.output.numel()} value(s) are rounded, by up to {off:.3g}")


_SWAMPING_OPS = ("aten.add", "aten.sub", "aten.rsub")
# Swamping is the finding's story when at least this share of the elements lose their small operand.
SWAMPED_SHARE = 0.5


@pattern("swamping", "a small operand lost against a large one",
         "keep the small value apart from the large one: reorder so the large values cancel first (x + (big - "
         "big)), add the small updates into a separate float32 total, or compute the addition in float32")
def _swamping(ev: Evidence) -> str | None:
    if ev.op not in _SWAMPING_OPS or ev.kind != "divergence" or not ev.output.is_floating_point():
        return None
    operands = [(n, t) for n, t in ev.inputs.items() if t.is_floating_point()]
    if len(operands) != 2:
        return None
    shape = ev.output.shape
    (name_a, a), (name_b, b) = [(n, torch.broadcast_to(t.double(), shape)) for n, t in operands]
    small, large = torch.minimum(a.abs(), b.abs()), torch.maximum(a.abs(), b.abs())
    spacing = _spacing(large, ev.output.dtype)
    lost = (small > 0) & (small < spacing / 2)
    if not (small > 0).any() or float(lost.sum()) < SWAMPED_SHARE * float((small > 0).sum()):
        return None
    smaller = name_a if float(a.abs().mean()) < float(b.abs().mean()) else name_b
    return (f"'{smaller}' (|x| up to {float(small[lost].max()):.3g}) is below half the spacing of {ev.dtype} next to "
            f"the other operand (|x| about {float(large[lost].mean()):.4g}, spacing {float(spacing[lost].max()):.3g}): "
            f"{int(lost.sum())} of {lost.numel()} element(s) lose it entirely")


def _spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance between neighbouring numbers of `dtype` at the magnitudes `x` (its ulp there)."""
    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(x.clamp_min(info.tiny)))
    return torch.pow(2.0, exponent) * info.eps


@pattern("inf-arithmetic", "NaN from arithmetic on an infinity",
         "remove the infinity where it is born (the `origin` in the evidence; the inf filter stops there): "
         "inf - inf, 0 * inf and inf / inf are NaN")
def _inf_arithmetic(ev: Evidence) -> str | None:
    if ev.kind != "nonfinite" or not ev.output.isnan().any():
        return None
    carriers = [name for name, t in ev.inputs.items() if t.is_floating_point() and t.isinf().any()]
    if not carriers:
        return None
    return f"'{carriers[0]}' carries an infinity into this {ev.op.removeprefix('aten.')}, which makes NaN of it"


@pattern("overflow", "overflow of the dtype's range",
         "rescale before the operation (divide early, normalise), or compute it in float32")
def _overflow(ev: Evidence) -> str | None:
    if ev.kind != "nonfinite" or not ev.output.isinf().any():
        return None
    if any(not torch.isfinite(t).all() for t in ev.operands()):
        return None
    largest = torch.finfo(ev.output.dtype).max
    return (f"{int(ev.output.isinf().sum())} result(s) exceed the largest {ev.dtype} ({largest:.4g}) although "
            "every operand is finite")
