"""An optimizer's hyperparameters changed on a branch: the update's nodes with other constants.

The learning rate of each step is a value of the Program, written by a node of its own (`lr`, `lr_group1`, ...:
hardware/frontends/optimizers.py): a new learning rate from step k patches those nodes of steps k and later, in
every param group, so with a scheduler the schedule is replaced by that number from step k on.
Adam's and AdamW's update nodes take their other numbers as arguments (`rewind::adam_update`): those are patched
directly.
Other updates bake the hyperparameters into their nodes as constants (SGD's learning rate is the `alpha` of the add
that writes each parameter; amsgrad's weight decay is folded into `1 - lr * weight_decay`). So there a
hyperparameter is changed by tracing the step again from the model file with the optimizer's param groups changed,
and patching each node whose constants differ (an attribute patch, checkpoint/branch.py): whatever the optimizer
derives from the hyperparameter changes with it. A change that adds or removes nodes (a weight decay from 0, a flag
such as nesterov) is refused: it is the file's to make.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from checkpoint.branch import AttributePatch, Patch, schema_names
from hardware.errors import ProgramLoadError, RewindError, echo
from hardware.frontends.optimizers import LR
from hardware.frontends.torch_export import user_file
from hardware.frontends.torch_train import entry_in, step_of, training_program
from hardware.optimizer_ops import ADAM_UPDATE, adam_argument
from hardware.program import Node, Program, Ref
from provenance.steps import check_step, counterparts, is_training

LR_OP = "aten.scalar_tensor.default"
NOT_HYPERPARAMETERS = ("params", "foreach", "fused", "capturable", "differentiable")  # param group keys of no number


def hyperparameter_patches(program: Program, model: str, entry: str, changes: dict, first: int = 0) -> list[Patch]:
    """Attribute patches of the update's nodes in steps `first` and later, for the optimizer of `model`'s `entry`
    with `changes` ({"lr": 0.01}) made to every param group."""
    if not is_training(program):
        raise RewindError(f"{program.name} is an inference pass: it has no optimizer (launch its training step, entry "
                          "train_step)")
    check_step(program, first)
    if not isinstance(changes, dict) or not changes:
        raise RewindError("name at least one of the optimizer's hyperparameters to change: {\"lr\": 0.01}")
    changes = dict(changes)
    patches = _lr_patches(program, changes.pop("lr"), first) if "lr" in changes else []
    if not changes:
        return patches
    adam = _adam_patches(program, changes, first)
    if adam is not None:
        return patches + adam
    changed = _retraced(program, model, entry, changes)
    step0 = program.nodes[: program.step_starts[1] if len(program.step_starts) > 1 else len(program.nodes)]
    if [(n.op, n.input_names()) for n in step0] != [(n.op, n.input_names()) for n in changed.nodes]:
        raise RewindError(f"setting {_listed(changes)} changes which nodes the update runs, not only their numbers: "
                          "change it in the file")
    for mine, theirs in zip(step0, changed.nodes):
        differ = _constants_changed(mine, theirs)
        if differ:
            patches += [AttributePatch.of(program.nodes[i], differ) for i in counterparts(program, mine.index, first)]
    if not patches:
        raise RewindError(f"the optimizer already has {_listed(changes)}: no node of its update changes")
    return patches


def _lr_patches(program: Program, lr: Any, first: int) -> list[Patch]:
    """The learning-rate nodes of steps `first` and later, each writing `lr`."""
    if not _number(lr) or lr < 0:
        raise RewindError(f"the {program.optimizer or 'optimizer'} optimizer's lr must be a finite number (0 or "
                          f"above); got {echo(repr(lr))}")
    nodes = [n for n in program.nodes if n.step == 0 and n.phase == "optimizer" and n.op == LR_OP
             and n.outputs and re.fullmatch(rf"{LR}(_group\d+)?", n.outputs[0])]
    if not nodes:
        raise RewindError(f"{program.name} has no learning-rate values (lr): it was recorded before they were; "
                          "launch the model file again")
    patches: list[Patch] = []
    for node in nodes:
        patches += [AttributePatch.of(program.nodes[i], {"s": float(lr)})
                    for i in counterparts(program, node.index, first) if program.nodes[i].args[0] != lr]
    if not patches:
        raise RewindError(f"the optimizer already has lr={lr!r} in every step from step {first} on: no node of its "
                          "update changes")
    return patches


def _adam_patches(program: Program, changes: dict, first: int) -> list[Patch] | None:
    """Adam's update nodes take its numbers as arguments (hardware/optimizer_ops.py): they change without tracing the
    step again. None when the update is not Adam's nodes, or a change is not one of its numbers (the trace says
    what the optimizer has)."""
    update = [n for n in program.nodes if n.step == 0 and n.phase == "optimizer"]
    if not update or any(n.op != ADAM_UPDATE for n in update):
        return None
    wanted: dict[str, Any] = {}
    for key, value in changes.items():
        held = tuple(adam_argument(update[0], b) for b in ("beta1", "beta2")) if key == "betas" else \
            adam_argument(update[0], key) if key in ("eps", "weight_decay") else None
        if held is None or not _numbers_like(value, held):
            return None
        wanted.update(zip(("beta1", "beta2"), value) if key == "betas" else [(key, value)])
    patches: list[Patch] = []
    for node in update:
        differ = {k: v for k, v in wanted.items() if adam_argument(node, k) != v}
        if differ:
            patches += [AttributePatch.of(program.nodes[i], differ) for i in counterparts(program, node.index, first)]
    if not patches:
        raise RewindError(f"the optimizer already has {_listed(changes)}: no node of its update changes")
    return patches


def _retraced(program: Program, model: str, entry: str, changes: dict) -> Program:
    """One training step of the model file, its optimizer's param groups changed."""
    file = Path(model)
    if not model or not file.is_file():
        raise RewindError("the optimizer's hyperparameters are changed by tracing the step again from its model file; "
                          "this pass has none (a trace)")
    try:
        with user_file(file) as module:
            entry = entry_in(module, entry)  # a file with no build() runs its train_step()
            step, _ = step_of(module, entry, file)
        if step is None:
            raise RewindError(f"{entry}() in {file.name} returns no optimizer")
        _change(step.optimizer, changes)
        return training_program(step, program.name, 1)
    except ProgramLoadError as exc:
        raise RewindError(f"tracing the step again with {_listed(changes)}: {exc}") from None


def _change(optimizer: Any, changes: dict) -> None:
    kind, held = type(optimizer).__name__, optimizer.param_groups[0]
    numbers = [k for k, v in held.items() if k not in NOT_HYPERPARAMETERS and _numbers_like(v, v)]
    for key, value in changes.items():
        if key not in numbers:
            flag = key in held and key not in NOT_HYPERPARAMETERS
            raise RewindError(f"the {kind} optimizer's {key} is a flag: it changes which nodes the update runs; set it "
                              "in the file" if flag else f"the {kind} optimizer has no hyperparameter "
                              f"{echo(repr(key))} (its hyperparameters: {', '.join(numbers)})")
        if not _numbers_like(value, held[key]):
            what = "a pair of numbers" if isinstance(held[key], (tuple, list)) else "a finite number"
            raise RewindError(f"the {kind} optimizer's {key} must be {what}; got {echo(repr(value))}")
        for group in optimizer.param_groups:
            group[key] = tuple(value) if isinstance(held[key], (tuple, list)) else value


def _numbers_like(value: Any, held: Any) -> bool:
    if isinstance(held, (tuple, list)):
        return isinstance(value, (tuple, list)) and len(value) == len(held) and all(_number(v) for v in value)
    return _number(value) and _number(held)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _constants_changed(mine: Node, theirs: Node) -> dict[str, Any]:
    """The op's arguments (by their schema names) that hold other constants in `theirs`."""
    names = schema_names(mine)
    out = {names[i]: b for i, (a, b) in enumerate(zip(mine.args, theirs.args)) if _constant(a) and a != b}
    out.update({k: v for k, v in theirs.kwargs.items() if _constant(v) and mine.kwargs.get(k) != v})
    return out


def _constant(value: Any) -> bool:
    return not isinstance(value, (Ref, list, tuple, dict))


def _listed(changes: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in changes.items())
