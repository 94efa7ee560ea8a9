"""Optimizer updates as single operators: one node writes a parameter's whole update.

torch.optim's single-tensor Adam/AdamW runs a dozen small ops per parameter in place; traced functionally they are a
dozen nodes, each a write the engine checks, logs and retains (551 nodes a step for a 2-layer GPT), which made the
optimizer most of a debuggable step's time. `rewind::adam_update` runs those ops (torch/optim/adam.py's
`_single_tensor_adam`, line for line, on copies) as one operator, registered with torch's dispatcher so a Program
or a trace names it like any aten op (`rewind.adam_update.default`): its writes are the new parameter, both moments
and the step count, each a value one can inspect, patch and compare. SGD's steps, whose learning rate is a value,
run `rewind::add_scaled` (torch.add with the value as its alpha).
Imported for its registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hardware.program import Node

ADAM_UPDATE = "rewind.adam_update.default"
# The hyperparameters the operator takes after the learning rate, by torch.optim's names where they are one number.
ADAM_ARGUMENTS = ("beta1", "beta2", "eps", "weight_decay", "decoupled", "maximize")


@torch.library.custom_op("rewind::adam_update", mutates_args=())
def adam_update(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: Tensor,
                beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
                maximize: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One Adam (AdamW when `decoupled`) update of a parameter: (parameter, exp_avg, exp_avg_sq, step) after it.
    The learning rate is a value (a float64 0-dim tensor: a scheduler's number in each step), read as the Python
    float torch.optim computes with."""
    param, exp_avg, exp_avg_sq, step = param.clone(), exp_avg.clone(), exp_avg_sq.clone(), step.clone()
    lr = lr.item()
    grad = -grad if maximize else grad
    step += 1
    if weight_decay != 0:
        if decoupled:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    count = step.item()
    bias_correction1 = 1 - beta1**count
    bias_correction2 = 1 - beta2**count
    denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))
    return param, exp_avg, exp_avg_sq, step


@adam_update.register_fake
def _adam_update_shapes(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: Tensor,
                        beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
                        maximize: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (torch.empty_like(param), torch.empty_like(exp_avg), torch.empty_like(exp_avg_sq),
            torch.empty_like(step))


@torch.library.custom_op("rewind::add_scaled", mutates_args=())
def add_scaled(input: Tensor, other: Tensor, alpha: Tensor, negated: bool) -> Tensor:
    """`input + alpha * other` (`- alpha * other` when `negated`), `alpha` a value (a float64 0-dim tensor: a learning
    rate, SGD's 1 - dampening) read as the Python float torch.optim passes as `alpha`: torch.add's one rounding,
    which a product then a sum of tensors would not be."""
    number = alpha.item()
    return input.add(other, alpha=-number if negated else number)


@add_scaled.register_fake
def _add_scaled_shape(input: Tensor, other: Tensor, alpha: Tensor, negated: bool) -> Tensor:
    return torch.empty_like(input)


def adam_argument(node: Node, name: str) -> Any:
    """The argument `name` (eps, lr, ...) of an `adam_update` node, as it was traced."""
    names = [a.name for a in torch.ops.rewind.adam_update.default._schema.arguments]
    i = names.index(name)
    return node.kwargs[name] if name in node.kwargs else node.args[i]
