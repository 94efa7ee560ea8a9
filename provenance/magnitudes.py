"""The magnitude a value was computed from: the scale its tolerance is measured against.

A value's rounding error is proportional to the terms that made it, not to the value itself: a weight gradient
summed over a batch whose terms cancel to 1e-7, or a loss of 1e-8 computed as `logits - logsumexp(logits)` from
logits of 50, carries an error of a few ulps of those terms. Judged against its own size it would look wrong
(provenance/compare.py measures |a - b| against rtol * max(|b|, scale)); judged against its operands' it is
right. So `scale` of a value is the root mean square of the largest of
- the value itself (the reference's), and
- for an op that sums terms or carries them linearly (a contraction, a reduction, a product, a loss, a view), the
  same op run on the magnitudes of its operands, each operand no smaller than its own scale: the sum of |terms|
  (|A| @ |B| for a matmul), carried through the chain of such ops. `log_softmax` is `x - logsumexp(x)`: its terms
  are |x| and logsumexp(x), and its backward's are |g| and softmax * sum |g|; a gradient op linear in the
  gradient it is given (relu's, gelu's, a `where`) carries that gradient's magnitude.
In the forward, only the losses and the ops that move values carry: the sums, products and subtractions the user
writes (`1 - cos(x)`, `E[x^2] - E[x]^2`, a float16 `x.half().sum()`) are judged as the values they are, so a
cancellation or a reduction that a reformulation fixes stays a divergence (provenance/patterns.py names it);
the backward's and the optimizer's ops, which autograd writes, carry their operands' terms.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from hardware.program import Node, Program

# Ops whose result is a sum or a linear carrier of its operands' terms: run on |operands| it gives the terms' size.
# In the forward only the losses and the ops that move values without arithmetic carry: a sum or a product the user
# writes is judged as the value it is (a float16 reduction of large terms is a bug to find, not an excuse), while
# the losses and autograd's gradients cancel by construction (a batch's gradient terms near convergence).
_MOVING = ("aten.t.", "aten.transpose.", "aten.permute.", "aten.view.", "aten.reshape.", "aten._unsafe_view.",
           "aten.expand.", "aten.clone.", "aten._to_copy.", "aten.squeeze.", "aten.unsqueeze.", "aten.flatten.",
           "aten.select.", "aten.slice.")
_LOSSES = ("aten.nll_loss_forward.", "aten.nll_loss_backward.", "aten.nll_loss.", "aten.cross_entropy_loss.",
           "aten._log_softmax.", "aten._log_softmax_backward_data.")
_CARRYING = _MOVING + _LOSSES + ("aten.mm.", "aten.bmm.", "aten.matmul.", "aten.addmm.", "aten.linear.",
                                 "aten.baddbmm.", "aten.sum.", "aten.mean.", "aten.mul.", "aten.div.", "aten.neg.",
                                 "aten.convolution.", "aten.convolution_backward.", "aten.einsum.",
                                 "aten.sum_to_size.")
# Gradient ops linear in the gradient they are given (the first operand): run on |gradient| and the rest as it is.
_LINEAR_IN_GRADIENT = ("aten.threshold_backward.", "aten.gelu_backward.", "aten.tanh_backward.",
                       "aten.sigmoid_backward.", "aten.silu_backward.", "aten.masked_fill.", "aten.where.")
_LOG_SOFTMAX, _LOG_SOFTMAX_BACKWARD = "aten._log_softmax.", "aten._log_softmax_backward_data."
_CROSS_ENTROPY = "aten.cross_entropy_loss."
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # aten's reduction enum
MAX_CHAIN = 256  # carriers followed upstream at most; beyond, a value's own size is its scale


class Magnitudes:
    """The scale of each value of `program`, from the reference's values (`reference`: a name's host tensor)."""

    def __init__(self, program: Program, reference: Callable[[str], torch.Tensor]):
        self.program = program
        self.reference = reference
        self._scale: dict[str, float] = {}

    def scale(self, name: str, depth: int = 0) -> float:
        if name not in self._scale:
            self._scale[name] = self._computed(name, depth)
        return self._scale[name]

    def _computed(self, name: str, depth: int) -> float:
        own = _rms(self.reference(name))
        info = self.program.values[name]
        if info.producer is None or depth > MAX_CHAIN:
            return own
        node = self.program.nodes[info.producer]
        if node.phase == "forward" and not node.op.startswith(_MOVING + _LOSSES):
            return own
        try:
            terms = self._terms(node, info.output_index, depth)
        except (RuntimeError, TypeError, ValueError, IndexError):  # the op does not take magnitudes: its own size
            return own
        return own if terms is None else max(own, _rms(terms))

    def _terms(self, node: Node, index: int, depth: int) -> torch.Tensor | None:
        """The size of the terms `node`'s output `index` was made of; None for an op that makes no sum of them."""
        if node.op.startswith(_LOG_SOFTMAX):
            x = self._magnitude(node.args[0], depth)
            return x + torch.logsumexp(self.reference(node.args[0].name).double(), node.args[1], keepdim=True).abs()
        if node.op.startswith(_CROSS_ENTROPY):  # log_softmax then nll: its terms gathered at the targets
            x, target = self.reference(node.args[0].name).double(), self.reference(node.args[1].name)
            dim = 1 if x.dim() > 1 else 0
            terms = self._magnitude(node.args[0], depth) + torch.logsumexp(x, dim, keepdim=True).abs()
            reduction = _REDUCTIONS[node.args[3] if len(node.args) > 3 else 1]
            return torch.nn.functional.nll_loss(-terms, target, reduction=reduction)
        if node.op.startswith(_LOG_SOFTMAX_BACKWARD):
            g = self._magnitude(node.args[0], depth)
            return g + self.reference(node.args[1].name).double().exp() * g.sum(node.args[2], keepdim=True)
        if node.op.startswith(_LINEAR_IN_GRADIENT):
            first = getattr(node.args[1 if node.op.startswith("aten.where.") else 0], "name", None)
            args, kwargs = node.bind(lambda n: self._magnitude_of(n, depth) if n == first else self.reference(n))
        elif node.op.startswith(_CARRYING):
            args, kwargs = node.bind(lambda n: self._magnitude_of(n, depth))
        else:
            return None
        result = node.target(*args, **kwargs)
        return (result if isinstance(result, torch.Tensor) else result[node.output_indices[index]]).abs()

    def _magnitude(self, ref, depth: int) -> torch.Tensor:
        return self._magnitude_of(ref.name, depth)

    def _magnitude_of(self, name: str, depth: int) -> torch.Tensor:
        """|value| elementwise, no smaller than the value's scale (integers, as they are: indices, targets)."""
        value = self.reference(name)
        if not value.is_floating_point():
            return value
        return value.double().abs().clamp_min(self.scale(name, depth + 1))


def _rms(tensor: torch.Tensor) -> float:
    if not tensor.is_floating_point() or not tensor.numel():
        return 0.0
    flat = tensor.detach().double().reshape(-1)
    flat = flat[torch.isfinite(flat)]
    value = float(flat.square().mean().sqrt()) if flat.numel() else 0.0
    return value if math.isfinite(value) else 0.0
