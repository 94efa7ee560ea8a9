"""The optimizers a training step runs, as functional tensor ops: torch.optim's single-tensor updates.

Each rule reads a param group's hyperparameters (`hyper`), the state a parameter starts from (`state`: what the
optimizer holds, or fresh) and computes one update (`update`: the new parameter and state tensors, by torch.optim's
state keys, the parameter as "param"). Traced by hardware/frontends/torch_train.py, they become optimizer nodes.

The numbers that change from step to step are tensors the update reads, each a value of the Program written by a
node of its own in every step (`step_numbers`): the learning rate of each param group (`lr`, `lr_group1`, ...: what
an lr scheduler sets it to in that step, `learning_rates`), and with SGD's dampening the weight of the gradient in
the momentum buffer (`momentum_grad_weight`: 1 - dampening, but 1 in the first step of a fresh buffer, which
torch.optim makes a copy of the gradient).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from hardware.errors import ProgramLoadError, raised_in_user_code
from hardware.optimizer_ops import ADAM_ARGUMENTS, adam_update, add_scaled

SUPPORTED_OPTIMIZERS = "torch.optim.SGD (lr, momentum, dampening, weight_decay, nesterov, maximize), " \
                       "torch.optim.Adam and torch.optim.AdamW (lr, betas, eps, weight_decay, amsgrad, maximize)"
LR = "lr"  # the value of a param group's learning rate in a step: `lr`, `lr_group1`, ...
GRAD_WEIGHT = "momentum_grad_weight"  # SGD's 1 - dampening, a value as the learning rate is


def rule_of(optimizer: torch.optim.Optimizer) -> type:
    """The update rule of a supported optimizer, its hyperparameters checked."""
    rule = _RULES.get(type(optimizer))
    if rule is None:
        raise ProgramLoadError(f"the optimizer is a {type(optimizer).__module__}.{type(optimizer).__qualname__}; "
                               f"Rewind runs {SUPPORTED_OPTIMIZERS}")
    for group in optimizer.param_groups:
        rule.hyper(group)
    return rule


def _number(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class _SGD:
    """torch.optim.SGD's single-tensor update (torch/optim/sgd.py), functional."""

    @staticmethod
    def hyper(group: dict) -> dict:
        hyper = {"lr": _number(group["lr"]), "momentum": _number(group.get("momentum", 0)),
                 "dampening": _number(group.get("dampening", 0)), "weight_decay": _number(group.get("weight_decay", 0)),
                 "nesterov": bool(group.get("nesterov")), "maximize": bool(group.get("maximize"))}
        if hyper["nesterov"] and (hyper["momentum"] <= 0 or hyper["dampening"] != 0):
            raise ProgramLoadError("SGD's nesterov momentum needs a momentum above 0 and no dampening (as torch.optim "
                                   "says)")
        return hyper

    @staticmethod
    def state(p: torch.Tensor, held: dict, hyper: dict) -> dict[str, torch.Tensor]:
        if not hyper["momentum"]:
            return {}
        # A fresh buffer of zeros: the first update makes it the gradient, as torch.optim's clone of it does (with
        # dampening, its step numbers weigh that first gradient 1: step_numbers).
        buf = held.get("momentum_buffer")
        return {"momentum_buffer": _held(buf, p, "momentum_buffer") if buf is not None else torch.zeros_like(p)}

    @staticmethod
    def step_numbers(hyper: dict, fresh: bool, steps: int) -> dict[str, list[float]]:
        """The numbers other than the learning rate that change from step to step: the gradient's weight in a
        dampened momentum buffer."""
        if not hyper["momentum"] or not hyper["dampening"]:
            return {}
        weight = 1 - hyper["dampening"]
        return {GRAD_WEIGHT: [1.0 if fresh else weight] + [weight] * (steps - 1)}

    @staticmethod
    def update(p: torch.Tensor, grad: torch.Tensor, state: dict, h: dict, numbers: dict) -> dict[str, torch.Tensor]:
        grad = -grad if h["maximize"] else grad
        if h["weight_decay"]:
            grad = grad.add(p, alpha=h["weight_decay"])
        out = {}
        if h["momentum"]:
            buf = state["momentum_buffer"].mul(h["momentum"])
            buf = out["momentum_buffer"] = add_scaled(buf, grad, numbers[GRAD_WEIGHT], False) \
                if GRAD_WEIGHT in numbers else buf.add(grad)
            grad = grad.add(buf, alpha=h["momentum"]) if h["nesterov"] else buf
        out["param"] = add_scaled(p, grad, numbers[LR], True)
        return out


class _Adam:
    """torch.optim.Adam's and AdamW's single-tensor update (torch/optim/adam.py): one `rewind::adam_update` node a
    parameter; with amsgrad, functional ops a node each (the step count is a tensor, as torch.optim keeps it, and the
    bias corrections are computed from it in float64, where torch computes them in Python floats)."""

    @staticmethod
    def hyper(group: dict) -> dict:
        beta1, beta2 = group["betas"]
        return {"lr": _number(group["lr"]), "beta1": _number(beta1), "beta2": _number(beta2),
                "eps": _number(group["eps"]), "weight_decay": _number(group.get("weight_decay", 0)),
                "decoupled": bool(group.get("decoupled_weight_decay")), "amsgrad": bool(group.get("amsgrad")),
                "maximize": bool(group.get("maximize"))}

    @staticmethod
    def state(p: torch.Tensor, held: dict, hyper: dict) -> dict[str, torch.Tensor]:
        keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if hyper["amsgrad"] else ())
        step = held.get("step", 0.0)
        out = {"step": torch.as_tensor(_number(step), dtype=torch.float32)}
        out.update({k: _held(held[k], p, k) if k in held else torch.zeros_like(p) for k in keys})
        return out

    @staticmethod
    def step_numbers(hyper: dict, fresh: bool, steps: int) -> dict[str, list[float]]:
        return {}

    @staticmethod
    def update(p: torch.Tensor, grad: torch.Tensor, state: dict, h: dict, numbers: dict) -> dict[str, torch.Tensor]:
        lr = numbers[LR]
        if not h["amsgrad"]:  # one node: hardware/optimizer_ops.py
            param, exp_avg, exp_avg_sq, step = adam_update(p, grad, state["exp_avg"], state["exp_avg_sq"],
                                                           state["step"], lr, *(h[k] for k in ADAM_ARGUMENTS))
            return {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "param": param}
        grad = -grad if h["maximize"] else grad
        step = state["step"].add(1)
        if h["weight_decay"] and h["decoupled"]:
            p = p.mul(1 - lr * h["weight_decay"])
        elif h["weight_decay"]:
            grad = grad.add(p, alpha=h["weight_decay"])
        exp_avg = state["exp_avg"].lerp(grad, 1 - h["beta1"])
        exp_avg_sq = state["exp_avg_sq"].mul(h["beta2"]).addcmul(grad, grad, value=1 - h["beta2"])
        out = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        exp_avg_sq = out["max_exp_avg_sq"] = torch.maximum(state["max_exp_avg_sq"], exp_avg_sq)
        count = step.to(torch.float64)
        step_size = lr / (1 - torch.pow(h["beta1"], count))
        denom = exp_avg_sq.sqrt().div((1 - torch.pow(h["beta2"], count)).sqrt()).add(h["eps"])
        out["param"] = p.sub(exp_avg.mul(step_size).div(denom))
        return out


_RULES = {torch.optim.SGD: _SGD, torch.optim.Adam: _Adam, torch.optim.AdamW: _Adam}


def learning_rates(optimizer: torch.optim.Optimizer, scheduler: Any, steps: int, file: Any) -> list[list[float]]:
    """The learning rate of each param group in each of `steps` steps: the optimizer's in every step, or as
    `scheduler` sets it after each step (scheduler.step() after optimizer.step(), as a training loop calls it). The
    scheduler and the optimizer's learning rates are left as they were."""
    now = [_number(g["lr"]) for g in optimizer.param_groups]
    if scheduler is None:
        return [now] * steps
    held, groups = scheduler.state_dict(), [dict(g) for g in optimizer.param_groups]
    rule, out, moved = rule_of(optimizer), [now], None
    others = [_others(rule, g) for g in optimizer.param_groups]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": no step runs here
            for _ in range(steps - 1):
                scheduler.step()
                out.append([_number(g["lr"]) for g in optimizer.param_groups])
                moved = moved or next((k for g, o in zip(optimizer.param_groups, others)
                                       for k, v in _others(rule, g).items() if v != o[k]), None)
    except Exception as exc:
        raise ProgramLoadError(f"the learning-rate scheduler {type(scheduler).__name__} failed to step: "
                               f"{raised_in_user_code(exc, file)}") from None
    finally:
        scheduler.load_state_dict(held)
        for group, before in zip(optimizer.param_groups, groups):
            group.update(before)
    if moved is not None:
        raise ProgramLoadError(f"the learning-rate scheduler {type(scheduler).__name__} changes the optimizer's "
                               f"{moved} from step to step, and Rewind follows a schedule of the learning rate only: "
                               "keep the rest fixed (OneCycleLR(..., cycle_momentum=False))")
    bad = next(((k, lr) for k, lrs in enumerate(out) for lr in lrs if not math.isfinite(lr)), None)
    if bad is not None:
        raise ProgramLoadError(f"the learning-rate scheduler {type(scheduler).__name__} sets the learning rate of "
                               f"step {bad[0]} to {bad[1]}: a learning rate is a finite number")
    return out


def _others(rule: type, group: dict) -> dict:
    """A param group's hyperparameters other than its learning rate."""
    return {k: v for k, v in rule.hyper(group).items() if k != "lr"}


def lr_name(group: int) -> str:
    return LR if group == 0 else f"{LR}_group{group}"


def _held(tensor: Any, p: torch.Tensor, key: str) -> torch.Tensor:
    """A state tensor the optimizer already holds, checked against its parameter."""
    if not isinstance(tensor, torch.Tensor) or tensor.shape != p.shape:
        held = f"of shape {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else f"a {type(tensor).__name__}"
        raise ProgramLoadError(f"the optimizer holds its state '{key}' of a parameter of shape {list(p.shape)} as "
                               f"{held}")
    return tensor.detach().clone()
