"""Optimizer updates as single operators: one node writes a parameter's whole update.

torch.optim's single-tensor Adam/AdamW runs a dozen small ops per parameter in place; traced functionally they are a
dozen nodes, each a write the engine checks, logs and retains (551 nodes a step for a 2-layer GPT), which made the
optimizer most of a debuggable step's time. `rewind::adam_update` runs those ops (torch/optim/adam.py's
`_single_tensor_adam`, line for line, on copies) as one operator, registered with torch's dispatcher so a Program
or a trace names it like any aten op (`rewind.adam_update.default`): its writes are the new parameter, both moments
and the step count, each a value one can inspect, patch and compare. Imported for its registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hardware.program import Node

ADAM_UPDATE = "rewind.adam_update.default"
# The hyperparameters the operator takes, by torch.optim's names where they are one number.
ADAM_ARGUMENTS = ("lr", "beta1", "beta2", "eps", "weight_decay", "decoupled", "maximize")


@torch.library.custom_op("rewind::adam_update", mutates_args=())
def adam_update(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
                beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
                maximize: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One Adam (AdamW when `decoupled`) update of a parameter: (parameter, exp_avg, exp_avg_sq, step) after it."""
    param, exp_avg, exp_avg_sq, step = param.clone(), exp_avg.clone(), exp_avg_sq.clone(), step.clone()
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
def _adam_update_shapes(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
                        beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
                        maximize: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (torch.empty_like(param), torch.empty_like(exp_avg), torch.empty_like(exp_avg_sq),
            torch.empty_like(step))


def adam_argument(node: Node, name: str) -> Any:
    """The argument `name` (eps, lr, ...) of an `adam_update` node, as it was traced."""
    names = [a.name for a in torch.ops.rewind.adam_update.default._schema.arguments]
    i = names.index(name)
    return node.kwargs[name] if name in node.kwargs else node.args[i]
