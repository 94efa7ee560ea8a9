"""A training step as a Program: forward, backward and the optimizer's update, unrolled over steps.

The model file defines `train_step()` beside `build()` (or alone: a load of the default entry, build, of a file
with only `train_step()` runs it, and says so to its `note`), returning
- `(module, inputs, loss_fn, optimizer)`: the last input is the target and the loss is
  `loss_fn(module(*inputs[:-1]), inputs[-1])`; a loss function of one required positional parameter (a closure
  over its target, `lambda out: mse_loss(out, y)`) takes the output alone: `loss_fn(module(*inputs))`, the tensors
  it closes over constants of the Program (the same in every step); or
- `(module, inputs, optimizer)`: `module(*inputs)` (or `module(**inputs)`) returns the loss, a 0-dim tensor or an
  output holding a `loss` (a Hugging Face model given its labels).
The optimizer is one of optimizers.SUPPORTED_OPTIMIZERS, its state as it is (fresh, or after steps the file
already took). After the optimizer the tuple may hold, in any order and each at most once, what a training loop
does around its step:
- a `torch.optim.lr_scheduler` scheduler of that optimizer: stepped after each step, as a loop calls
  scheduler.step() after optimizer.step() (one that reads the losses, ReduceLROnPlateau, is refused);
- a `torch.amp.GradScaler`: `scaler.scale(loss).backward(); scaler.unscale_(opt); scaler.step(opt);
  scaler.update()` (loss_scaling.py);
- a dict of the step's options: `"accumulate": N`, N micro-batches a step (N forwards and backwards, their gradients
  summed as .backward() sums them, before one update: divide the loss by N in the loss function for a mean), and
  `"clip_grad_norm": max_norm`, `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` after the backward
  (and the scaler's unscale).
Each step starts from no gradients, as `opt.zero_grad(set_to_none=True)` (torch's default) leaves them: a parameter
the loss does not reach has no gradient and is not updated. An optional `batches()` in the file yields the inputs
of each step (of each micro-batch, in order) in turn (the first's included), laid out as train_step()'s; without
it every step takes train_step()'s inputs. Any entry that returns an optimizer is a training step; `train_step` is
the name by convention. A step function of the user's own, calling backward(), clip_grad_norm_ and opt.step()
(`train_step(x, y)` itself, or `train_step()` returning `(step, inputs)`), is read as it runs (user_step.py) into
the same Program: the update is Rewind's functional one (optimizers.py) either way, so its nodes are values to
inspect and patch, placed at the lines of the user's calls. Random ops draw
from the CPU generator's state as it stood when
train_step() returned (an eager loop run then draws the same numbers).

The trace runs with torch's Python dispatcher, so an op with a traceable decomposition runs it (one_hot with its
number of classes compares with an arange, where its eager kernel reads the labels to check them), as torch.export
and AOTAutograd do. A step that cannot be traced is a ProgramLoadError saying, at the user's line, what to change
(step_failures.py); nothing torch prints of it reaches the user.

The route: torch.export of the module and its loss (user frames and module stacks as an inference Program has
them), then make_fx over that graph run by an fx Interpreter, `torch.autograd.grad` and the optimizer's update
written as functional tensor ops (Adam's and AdamW's as one `rewind::adam_update` node a parameter,
hardware/optimizer_ops.py: a dozen nodes a parameter made the update most of a debuggable step's time). With node
metadata preserved, autograd's sequence numbers reach the traced backward ops (torch.fx.traceback.set_grad_fn_seq_nr
from a hook on each autograd node, as AOTAutograd does): each backward op carries the number of the forward op it
differentiates.

The Program's shape (what the Session, forensics and benchmarks may rely on):
- Nodes in order: step 0's forward (`phase` "forward"; loc, frames and module_stack as in an inference Program),
  its backward ("backward": `differentiates` is the index of the forward node whose gradient it computes, whose
  loc, frames and module_stack it carries; named `<forward node>_backward`, `_backward_1`, ...; a backward op
  autograd ran outside any forward op's backward has `differentiates` None and no frames), its update
  ("optimizer", no frames); then step 1's, and so on. Each node has its `step` (from 0);
  `Program.step_starts[k]` is step k's first node. A random op (dropout in train mode, randn_like, bernoulli, ...;
  hardware/random_ops.RANDOM_OPS) is its seeded twin `rewind.seeded_<op>`: it reads the generator state `rng_state`
  (a buffer, uint8, the CPU generator's state; there only when the step draws) and writes the state after its draw
  (`rng_state_updated`, recorded as a write of `rng_state`): a replay draws the same numbers. Any other random op,
  or one given a torch.Generator of its own, is refused.
- Numbers that change from step to step are values, each written by a node of the step's update (an
  `aten.scalar_tensor`, float64, named as its value): each param group's learning rate (`lr`, `lr_group1`; what the
  scheduler sets in that step, `lr_step3`), and with SGD's dampening `momentum_grad_weight` (optimizers.py). A
  GradScaler's step has `found_inf` (1.0 when a gradient holds a NaN/Inf: the update's every output is then the
  value it replaces, the step skipped) and carries `grad_scale` (float32) and `growth_tracker` (int32) as state.
  With accumulation, micro-batch i>0's inputs are `<input>_micro<i>` (`x_micro1`) and `loss` is the sum of the
  micro-batches' losses; `grad_<parameter>` is the gradient the update reads (summed, unscaled, clipped).
- Values: the inputs (named by the forward's parameters or keywords; the target by the loss function's second
  parameter, else `target`), parameters `p_<attribute path>` (`p_l1_weight` for `l1.weight`, as torch.export
  names them), buffers `b_...`, constants `c_...`, and the optimizer's state per parameter, kind "buffer", named
  `<state>_<parameter>` as torch.optim keeps it (`exp_avg_p_l1_weight`, `exp_avg_sq_...`, `max_exp_avg_sq_...`,
  `step_...` (float32, 0-dim), `momentum_buffer_...`).
- The loss of step k is `Program.losses[k]` (`loss`); the Program's outputs are the losses, then the last step's
  updates (the trained parameters, buffers and optimizer state). The gradient of a parameter is the value
  `grad_<parameter>` (`grad_p_l1_weight`; print it, `$grad_p_l1_weight`); `Program.gradients[k]` maps each
  parameter to its gradient in step k (a parameter the loss does not reach has none, and is not updated).
- An update writes `<parameter or state>_updated`, and `buffer_mutations` records it as a write of the parameter
  or state value itself: a data breakpoint on `p_l1_weight` fires at each update, and the parameter read at a
  tick is the one it holds then. A step reads the values the step before it updated; a buffer the forward
  mutates (BatchNorm's running statistics in train mode) is carried the same way.
- Step k >= 1 repeats step 0's nodes: every node and every value its nodes write is named as in step 0 with
  `_step<k>` appended (`loss_step2`, `grad_p_l1_weight_step2`); the inputs batches() gave step k are `x_step<k>`.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import operator
import re
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
import torch.fx.traceback as fx_traceback
from torch._dispatch.python import enable_python_dispatcher
from torch.export import ExportedProgram
from torch.export._tree_utils import reorder_kwargs
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind
from torch.fx.experimental.proxy_tensor import (disable_proxy_modes_tracing, get_proxy_mode, make_fx,
                                               track_tensor_tree)
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from hardware.errors import ProgramLoadError, echo, raised_in_user_code
from hardware.frontends.loss_scaling import FOUND_INF, SCALE, TRACKER, LossScaling
from hardware.frontends.optimizers import LR, learning_rates, lr_name, rule_of
from hardware.frontends.user_step import (UserStep, batches_once, first_batch, is_step_function, takes_a_batch,
                                          yields_batches)
from hardware.frontends.step_failures import StepWhere, data_shaped, step_failure
from hardware.frontends.torch_export import (Inputs, call_entry, check_input_types, checked_inputs, convert_node,
                                             export, export_program, module_and_inputs, positional_names,
                                             source_files, split_inputs, tensor_inputs, user_file)
from hardware.program import Node, Program, ValueInfo, renamed_refs
from hardware.random_ops import RANDOM_OPS, draw_dtype, seeded
from hardware.torch_tensors import COLLECTIVE_NAMESPACE, dtype_name

TRAIN_ENTRY = "train_step"
DEFAULT_ENTRY = "build"
TRAIN_RETURNS = "(module, inputs, loss_fn, optimizer), or (module, inputs, optimizer) when module(*inputs) returns " \
                "the loss; after the optimizer, optionally its learning-rate scheduler, a torch.amp.GradScaler and a " \
                "dict of the step's options ({\"accumulate\": 4, \"clip_grad_norm\": 1.0}); or (step, inputs), a " \
                "step function of your own calling loss.backward() and opt.step()"
MAX_ACCUMULATE = 256  # micro-batches a step
BATCHES = "batches"
MAX_STEPS = 10_000
MAX_NODES = 250_000  # an unrolled Program's nodes: what a Timeline over it can hold and step through
_PHASE = "rewind_phase"  # the key of the annotation that marks the traced backward and update
_CALL = "rewind_call"  # the key of the annotation that marks the part of the update a node is of (UserStep.sites)
RNG_STATE = "rng_state"  # the CPU generator's state, threaded through the random nodes (hardware/random_ops.py)
_HOOK = "rewind_hook"  # the key of the annotation that marks what a parameter's gradient hook traced
_WRAPPED = "model"  # the user's module inside the exported one
_ALIASES = ("aten.detach.default", "aten.alias.default")  # the same values under another name: no node


@dataclass
class TrainingStep:
    """What a train_step() returned, checked."""

    model: torch.nn.Module
    inputs: Inputs
    loss_fn: Callable | None
    optimizer: torch.optim.Optimizer
    loss_takes_target: bool = True  # loss_fn(output, target), the last input the target; else loss_fn(output)
    # The CPU generator's state when train_step() returned: the first step's random ops draw from it, as an eager
    # loop run then would.
    rng_state: torch.Tensor = field(default_factory=torch.get_rng_state)
    scheduler: Any = None  # a torch.optim.lr_scheduler.LRScheduler of the optimizer, stepped after each step
    scaling: LossScaling | None = None  # a torch.amp.GradScaler's settings and state
    accumulate: int = 1  # micro-batches a step: forwards and backwards before one update
    clip_grad_norm: float | None = None  # the gradients' total norm is clipped to this before the update
    learning_rates: list[list[float]] = field(default_factory=list)  # each step's, each param group's (steps long)
    file: Path | None = None  # the model file (a failing scheduler names its line)
    user: UserStep | None = None  # the user's own step function (user_step.py): what it calls sets the above


def load_program(path: str | Path, entry: str = "build", steps: int = 1,
                 note: Callable[[str], None] | None = None) -> Program:
    """The Program of a model file's entry: its training step unrolled `steps` times when the entry returns an
    optimizer (train_step()), else its inference pass (build()). `note` hears that a file with no build() but a
    train_step() runs its training step."""
    check_steps(steps)
    file = Path(path)
    with user_file(file) as module:
        entry = entry_in(module, entry, note)
        batches_once(module)
        step, result = step_of(module, entry, file)
        batches = read_batches(module, file, step, steps) if step is not None else None
    if step is None:
        if steps != 1:
            raise ProgramLoadError(f"steps counts training steps, and {entry}() in {file} returns no optimizer: "
                                   f"launch a training step (entry '{TRAIN_ENTRY}', returning {TRAIN_RETURNS})")
        model, inputs = module_and_inputs(result, entry, file)
        return export_program(model, inputs, name=file.stem)
    return training_program(step, file.stem, steps, batches)


def step_of(module: ModuleType, entry: str, file: Path) -> tuple[TrainingStep | None, Any]:
    """The training step of a file's entry (None for an inference entry) and what the entry returned: the entry
    called, or, when it takes a batch (`train_step(x, y)`, user_step.py), the step itself on batches()' first."""
    fn = getattr(module, entry, None)
    if takes_a_batch(fn):
        user = UserStep.of(fn, f"{entry}() in {file}")
        inputs = checked_inputs(first_batch(module, entry, file), f"the first batch of batches() in {file} for "
                                                                  f"{entry}() is")
        return user_training_step(user, inputs, file), None
    result = call_entry(module, entry, TRAIN_RETURNS if entry == TRAIN_ENTRY else "(module, inputs)")
    return training_step(result, entry, file), result


def user_training_step(user: UserStep, inputs: Inputs, file: Path) -> TrainingStep:
    """A step the user wrote (user_step.py), and the inputs it takes."""
    rule_of(user.optimizer)
    return TrainingStep(user.model, inputs, None, user.optimizer, loss_takes_target=False, file=file, user=user)


def entry_in(module: ModuleType, entry: str, note: Callable[[str], None] | None = None) -> str:
    """The entry a load calls: `entry`, or train_step for the default entry (build) of a file that defines only
    train_step (said to `note` in one line)."""
    if entry != DEFAULT_ENTRY or hasattr(module, DEFAULT_ENTRY) or not callable(getattr(module, TRAIN_ENTRY, None)):
        return entry
    if note is not None:
        note(f"{Path(module.__file__).name} defines {TRAIN_ENTRY}() and no {DEFAULT_ENTRY}(): running its training "
             f"step (entry {TRAIN_ENTRY})")
    return TRAIN_ENTRY


def check_steps(steps: Any) -> None:
    if type(steps) is not int or not 1 <= steps <= MAX_STEPS:
        raise ProgramLoadError(f"steps is the number of training steps, a whole number from 1 to {MAX_STEPS}; "
                               f"got {echo(repr(steps))}")


def training_step(result: Any, entry: str, file: Path) -> TrainingStep | None:
    """The parts of an entry's result that is a training step (it holds an optimizer), checked; None for any other
    result (an entry named train_step must be one)."""
    if isinstance(result, tuple) and len(result) == 2 and is_step_function(result[0]):  # (step, inputs)
        user = UserStep.of(result[0], f"{entry}() in {file} returned")
        return user_training_step(user, checked_inputs(result[1], f"{entry}() in {file} returned"), file)
    at = next((i for i, r in enumerate(result) if isinstance(r, torch.optim.Optimizer)), None) \
        if isinstance(result, tuple) else None
    if at is None and entry != TRAIN_ENTRY:
        return None
    if at is None or at not in (2, 3):
        raise ProgramLoadError(f"{entry}() in {file} must return {TRAIN_RETURNS}; got {_kinds(result)}")
    (model, inputs, *loss), optimizer = result[:at], result[at]
    if not isinstance(model, torch.nn.Module):
        raise ProgramLoadError(f"{entry}() in {file} returned {type(model).__name__} where a torch.nn.Module belongs")
    inputs = checked_inputs(inputs, f"{entry}() in {file} returned")
    loss_fn = loss[0] if loss else None
    if loss and not callable(loss_fn):
        raise ProgramLoadError(f"{entry}() in {file} returned a {type(loss_fn).__name__} where the loss function "
                               "belongs (called as loss_fn(output, target), or loss_fn(output))")
    takes_target = loss_fn is not None and _takes_target(loss_fn)
    if takes_target and (isinstance(inputs, dict) or len(inputs) < 2):
        raise ProgramLoadError(f"{entry}() in {file} returned a loss function of the output and the target, so its "
                               "inputs are the module's inputs then the target, as a tuple (loss_fn(module("
                               "*inputs[:-1]), inputs[-1])); got "
                               f"{'a dict' if isinstance(inputs, dict) else _count(len(inputs), 'input', 'inputs')}: "
                               "give the target among the inputs, or a loss of the output alone (lambda out: ...)")
    rule_of(optimizer)
    owned = {id(p) for p in model.parameters()}
    if any(id(p) not in owned for group in optimizer.param_groups for p in group["params"]):
        raise ProgramLoadError(f"the optimizer {entry}() in {file} returned updates a tensor that is not a parameter "
                               "of its module")
    step = TrainingStep(model, inputs, loss_fn, optimizer, takes_target, file=file)
    _read_extras(step, result[at + 1:], f"{entry}() in {file}")
    return step


def _read_extras(step: TrainingStep, extras: tuple, where: str) -> None:
    """What a train_step() returned after its optimizer: a learning-rate scheduler, a GradScaler, the step's options
    (a dict), each at most once."""
    seen: set[str] = set()
    for extra in extras:
        kind = "scheduler" if isinstance(extra, torch.optim.lr_scheduler.LRScheduler) else \
            "scaler" if isinstance(extra, torch.amp.GradScaler) else "options" if isinstance(extra, dict) else None
        if kind is None:
            raise ProgramLoadError(f"{where} returned a {type(extra).__name__} after the optimizer, where its "
                                   "learning-rate scheduler, a torch.amp.GradScaler or a dict of the step's options "
                                   "belongs")
        if kind in seen:
            raise ProgramLoadError(f"{where} returned two {_EXTRAS[kind]} after the optimizer; a step takes one")
        seen.add(kind)
        if kind == "scheduler":
            step.scheduler = _scheduler(extra, step.optimizer, where)
        elif kind == "scaler":
            step.scaling = LossScaling.of(extra, where)
        else:
            _read_options(step, extra, where)


_EXTRAS = {"scheduler": "learning-rate schedulers", "scaler": "GradScalers", "options": "dicts of options"}


def _scheduler(scheduler: Any, optimizer: torch.optim.Optimizer, where: str) -> Any:
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ProgramLoadError(f"{where} returned a ReduceLROnPlateau scheduler, which sets the learning rate from "
                               "the losses it is given, values a traced step cannot read: use a schedule of the step "
                               "count (LambdaLR, StepLR, CosineAnnealingLR, ...)")
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise ProgramLoadError(f"the learning-rate scheduler {where} returned schedules another optimizer than the "
                               "one it returned")
    return scheduler


STEP_OPTIONS = {"accumulate": "the micro-batches of a step, a whole number from 1 to " + str(MAX_ACCUMULATE),
                "clip_grad_norm": "the total norm the gradients are clipped to (clip_grad_norm_'s max_norm), a "
                                  "finite number above 0"}


def _read_options(step: TrainingStep, options: dict, where: str) -> None:
    for key, value in options.items():
        if key not in STEP_OPTIONS:
            raise ProgramLoadError(f"{where} returned the step option {echo(repr(key))}; a step's options are "
                                   + "; ".join(f"{k}: {what}" for k, what in STEP_OPTIONS.items()))
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        fits = (type(value) is int and 1 <= value <= MAX_ACCUMULATE) if key == "accumulate" else \
            number and math.isfinite(value) and value > 0
        if not fits:
            raise ProgramLoadError(f"{where} returned the step option {key}={echo(repr(value))}; {key} is "
                                   f"{STEP_OPTIONS[key]}")
    step.accumulate = options.get("accumulate", 1)
    step.clip_grad_norm = float(options["clip_grad_norm"]) if "clip_grad_norm" in options else None


def _takes_target(loss_fn: Callable) -> bool:
    """Does the loss function take the target after the output? A function of one required positional parameter
    (a closure over its target, `lambda out: ...`) takes the output alone; a loss module (nn.CrossEntropyLoss) or
    a function of two, or of `*args`, takes the target too."""
    fn = loss_fn.forward if isinstance(loss_fn, torch.nn.Module) else loss_fn
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin Python cannot read: as torch's losses, (input, target)
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return len(required) != 1


def _kinds(result: Any) -> str:
    if isinstance(result, tuple):
        return f"({', '.join(type(r).__name__ for r in result)})"
    return f"a {type(result).__name__}"


def read_batches(module: ModuleType, file: Path, step: TrainingStep, steps: int) -> list[Inputs] | None:
    """The inputs of each of `steps` steps from the file's batches() (of each micro-batch, `step.accumulate` a step,
    in order), each laid out as train_step()'s; None when the file has no batches()."""
    fn = getattr(module, BATCHES, None)
    if fn is None:
        return None
    if not callable(fn):
        raise ProgramLoadError(f"'{BATCHES}' in {file} is not callable (it yields the inputs of each step)")
    try:
        batches = fn()
        if not yields_batches(batches):
            raise ProgramLoadError(f"{BATCHES}() in {file} must yield the inputs of each step (a generator); it "
                                   f"returned {echo(repr(batches))}")
        found = list(itertools.islice(batches, steps * step.accumulate))
    except ProgramLoadError:
        raise
    except Exception as exc:
        raise ProgramLoadError(f"calling {BATCHES}() in {file} failed: {raised_in_user_code(exc, file)}") from exc
    if len(found) < steps * step.accumulate:
        micro = f" of {step.accumulate} micro-batches" if step.accumulate > 1 else ""
        raise ProgramLoadError(f"{BATCHES}() in {file} gave {_count(len(found), 'batch', 'batches')}; {steps} steps"
                               f"{micro} need {steps * step.accumulate}")
    return [_same_layout(checked_inputs(b, f"batch {k} of {BATCHES}() in {file} gave"), step.inputs, k, file)
            for k, b in enumerate(found)]


def _same_layout(batch: Inputs, inputs: Inputs, k: int, file: Path) -> Inputs:
    """A batch laid out as the inputs the step was exported for: the same structure, tensors of the same dtype and
    shape, the same fixed numbers and strings."""
    got, spec = pytree.tree_flatten_with_path(batch)
    want, want_spec = pytree.tree_flatten_with_path(inputs)
    where = f"batch {k} of {BATCHES}() in {file}"
    if spec != want_spec:
        raise ProgramLoadError(f"{where} is laid out as {_layout(batch)}; train_step()'s inputs are {_layout(inputs)}")
    for (path, leaf), (_, expected) in zip(got, want):
        if isinstance(expected, torch.Tensor) and isinstance(leaf, torch.Tensor):
            if (leaf.dtype, leaf.shape) != (expected.dtype, expected.shape):
                raise ProgramLoadError(f"{where}: input {pytree.keystr(path)} is {_tensor_kind(leaf)}; the step "
                                       f"was exported for {_tensor_kind(expected)} (train_step()'s inputs)")
        elif type(leaf) is not type(expected) or leaf != expected:
            raise ProgramLoadError(f"{where}: input {pytree.keystr(path)} is {echo(repr(leaf))} where train_step() "
                                   f"gave {echo(repr(expected))} (fixed at export)")
    return batch


def _layout(inputs: Inputs) -> str:
    if isinstance(inputs, dict):
        return f"keywords {sorted(inputs)}"
    return _count(len(inputs), "positional input", "positional inputs")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _tensor_kind(t: torch.Tensor) -> str:
    return f"{dtype_name(t.dtype)}{list(t.shape)}"


# -- one step, exported and traced ------------------------------------------------------------------------------

class _LossOf(torch.nn.Module):
    """The user's module and its loss as one module whose forward returns the loss: what is exported."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable | None, takes_target: bool = True,
                 user: UserStep | None = None):
        super().__init__()
        self.takes_target = takes_target
        self.user = user
        self.model = model  # named _WRAPPED: the Program names its parameters and modules without it
        if loss_fn is not None and not isinstance(loss_fn, torch.nn.Module):
            # Export keeps the frames of forward methods only, and of functions annotated: the loss function's
            # lines are the user's too.
            loss_fn = fx_traceback.annotate_fn({})(loss_fn)
        self.loss_fn = loss_fn

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.user is not None:
            return self.user.run(args, kwargs)
        if self.loss_fn is None:
            return _loss_in(self.model(*args, **kwargs))
        if not self.takes_target:
            return self.loss_fn(self.model(*args, **kwargs))
        return self.loss_fn(self.model(*args[:-1]), args[-1])


def _read_user_step(step: TrainingStep, steps: int) -> None:
    """What the user's own step called, as the options of a returned step would say it (user_step.py)."""
    user = step.user
    user.check_steps(steps)
    step.clip_grad_norm = user.clip_grad_norm
    step.scheduler = user.scheduler
    step.scaling = LossScaling.of(user.scaler, user.where) if user.scaled else None


def _loss_in(output: Any) -> Any:
    """The loss a module's forward returned: itself, or the `loss` of an output (a Hugging Face ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if loss is None:
        raise ProgramLoadError(f"the module returned a {type(output).__name__} without a loss; a training step with "
                               "no loss function needs a module whose forward returns the loss")
    return loss


def training_program(step: TrainingStep, name: str, steps: int = 1, batches: list[Inputs] | None = None) -> Program:
    """The Program of `steps` training steps (see the module's docstring)."""
    check_steps(steps)
    args, kwargs = split_inputs(step.inputs)
    check_input_types(step.model, args, kwargs)
    ep = export(_LossOf(step.model, step.loss_fn, step.loss_takes_target, step.user), args, kwargs, name, step.model)
    if step.user is not None:
        _read_user_step(step, steps)
    refused = data_shaped(ep.graph)
    if refused is not None:
        raise ProgramLoadError(refused)
    step.learning_rates = learning_rates(step.optimizer, step.scheduler, steps, step.file or name)
    micro = [tensor_inputs(ep, *split_inputs(b)) for b in batches] if batches is not None else None
    first = micro[: step.accumulate] if micro is not None else [tensor_inputs(ep, args, kwargs)] * step.accumulate
    one = _Tracer(ep, step, first, steps).trace()
    if steps * len(one.nodes) > MAX_NODES:
        raise ProgramLoadError(f"{steps} steps of {len(one.nodes)} nodes each make {steps * len(one.nodes)} nodes; "
                               f"a Program holds at most {MAX_NODES}: at most {MAX_NODES // len(one.nodes)} steps of "
                               "this model")
    a = step.accumulate
    inputs = [tuple(t for m in micro[k * a:(k + 1) * a] for t in m) for k in range(steps)] if micro else None
    program = one.unrolled(name, steps, inputs)
    program.optimizer = type(step.optimizer).__name__  # an update reads "AdamW update of q.weight"
    return program


@dataclass
class _OneStep:
    """Step 0 of a training Program, and what repeating it needs."""

    nodes: list[Node]
    values: dict[str, ValueInfo]  # every value step 0 has: its initial ones and what its nodes write
    initial: dict[str, Any]
    inputs: list[str]  # the user's tensor inputs, in order
    updates: dict[str, str]  # the value a step updates (parameter, buffer, optimizer state) -> its updated value
    gradients: dict[str, str]  # parameter -> its gradient
    loss: str
    numbers: dict[str, list[float]] = field(default_factory=dict)  # a step number's value -> its number per step

    def unrolled(self, name: str, steps: int, batches: list[tuple] | None) -> Program:
        """`steps` copies of the step, each reading what the one before it updated (and its batch's inputs)."""
        nodes, values, initial = list(self.nodes), dict(self.values), dict(self.initial)
        mutations = {new: old for old, new in self.updates.items()}
        if batches is not None:
            initial.update((n, t.detach()) for n, t in zip(self.inputs, batches[0]))
        starts, losses, gradients = [0], [self.loss], [dict(self.gradients)]
        written = {n for node in self.nodes for n in node.outputs}
        for k in range(1, steps):
            fresh = {n: f"{n}_step{k}" for n in (written | set(self.inputs) if batches is not None else written)}
            taken = next((new for new in fresh.values() if new in values), None)
            if taken is not None:
                raise ProgramLoadError(f"step {k} would name a value '{taken}', a name the program has already")
            rename = {**fresh, **{old: _in_step(new, k - 1) for old, new in self.updates.items()}}
            if batches is not None:
                for n, t in zip(self.inputs, batches[k]):
                    values[rename[n]] = replace(self.values[n], name=rename[n])
                    initial[rename[n]] = t.detach()
            offset = len(nodes)
            starts.append(offset)
            for node in self.nodes:
                nodes.append(_repeated(node, k, offset, rename, self.numbers))
            for n in written:
                info = self.values[n]
                values[rename[n]] = replace(info, name=rename[n], producer=info.producer + offset, last_use=-1)
            mutations.update({rename[new]: old for old, new in self.updates.items()})
            losses.append(rename[self.loss])
            gradients.append({p: rename[g] for p, g in self.gradients.items()})
        final = [_in_step(new, steps - 1) for new in self.updates.values()]  # what the run trained
        return Program(name=name, nodes=nodes, values=values, initial=initial, outputs=losses + final,
                       buffer_mutations=mutations, source_files=source_files(self.nodes), step_starts=starts,
                       losses=losses, gradients=gradients)


def _in_step(name: str, k: int) -> str:
    return name if k == 0 else f"{name}_step{k}"


def _repeated(node: Node, k: int, offset: int, rename: dict[str, str], numbers: dict[str, list[float]]) -> Node:
    """Step 0's `node` as step k runs it (a node writing a step number, its number in step k)."""
    args = renamed_refs(node.args, rename)
    if node.outputs and node.outputs[0] in numbers:
        args = (numbers[node.outputs[0]][k], *args[1:])
    return replace(node, index=node.index + offset, name=f"{node.name}_step{k}", step=k,
                   args=args, kwargs=renamed_refs(node.kwargs, rename),
                   outputs=[rename[o] for o in node.outputs],
                   differentiates=None if node.differentiates is None else node.differentiates + offset)


@dataclass
class _Update:
    """How the optimizer updates one parameter: its rule, its group's hyperparameters, its state."""

    rule: Callable[..., dict[str, torch.Tensor]]
    hyper: dict[str, Any]
    state: dict[str, str]  # torch.optim's state key -> the Program value holding it
    numbers: dict[str, str]  # the numbers that change from step to step (lr, ...) -> the values holding them


@dataclass
class _Tracer:
    """Traces one training step of an exported module-and-loss into step 0 of a Program."""

    ep: ExportedProgram
    step: TrainingStep
    user_tensors: list[tuple]  # each micro-batch's tensor inputs (one without accumulation)
    steps: int = 1
    flat: dict[str, torch.Tensor] = field(default_factory=dict)  # every traced input, by value name, in order
    values: dict[str, ValueInfo] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the value of each placeholder of the exported graph
    inputs: list[str] = field(default_factory=list)  # every micro-batch's, in order
    micro: list[dict[str, str]] = field(default_factory=list)  # micro-batch i>0: its input's value for micro 0's
    updates: dict[str, _Update] = field(default_factory=dict)  # parameter -> its update
    numbers: dict[str, list[float]] = field(default_factory=dict)  # a step number's value -> its number per step

    def trace(self) -> _OneStep:
        _check_loss(self.ep)
        self._name_inputs()
        self._plan_updates()
        gm, layout = self._make_fx()
        return self._convert(gm, layout)

    # -- the values a step starts from ----------------------------------------------------------------------------
    def _add(self, name: str, kind: str, tensor: torch.Tensor, target: str | None = None) -> None:
        if name in self.flat:
            raise ProgramLoadError(f"two values of the training step would both be named '{name}'")
        tensor = tensor.detach()
        self.flat[name] = tensor
        self.values[name] = ValueInfo(name, kind, dtype_name(tensor.dtype), tuple(tensor.shape), target=target)

    def _name_inputs(self) -> None:
        sig, state = self.ep.graph_signature, {**self.ep.state_dict, **self.ep.constants}
        labels = iter(self._input_labels())
        tensors = iter(self.user_tensors[0])
        tied: dict[int, str] = {}  # a parameter's tensor -> its value: tied parameters are one, their gradients summed
        kinds = {InputKind.PARAMETER: ("parameter", "p_"), InputKind.BUFFER: ("buffer", "b_"),
                 InputKind.CONSTANT_TENSOR: ("constant", "c_")}
        for spec in sig.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                if isinstance(spec.arg, ConstantArgument):
                    continue  # a number, string or None: part of the graph now
                name = next(labels)
                self._add(name, "input", next(tensors))
                self.inputs.append(name)
            elif spec.kind in kinds:
                kind, prefix = kinds[spec.kind]
                target = _unwrapped_path(spec.target)
                tensor = state[spec.target]
                if not isinstance(tensor, torch.Tensor):
                    raise ProgramLoadError(f"'{target}' is a {type(tensor).__name__}; only tensors are supported")
                name = tied.get(id(tensor)) if spec.kind == InputKind.PARAMETER else None
                if name is None:  # a parameter tied to one before it (GPT-2's lm_head to its wte) is that one
                    name = prefix + re.sub(r"\W", "_", target)
                    self._add(name, kind, tensor, target)
                    tied.setdefault(id(tensor), name)
            elif isinstance(state.get(spec.target), torch.Generator):
                raise ProgramLoadError(_OWN_GENERATOR.format(op=_user_op(self.ep, spec.arg.name)))
            else:
                raise ProgramLoadError(f"the training step takes a {spec.kind.name.lower()} '{spec.arg.name}', "
                                       "which Rewind does not support")
            self.order.append(name)
        first = list(self.inputs)
        for i, tensors in enumerate(self.user_tensors[1:], 1):  # each further micro-batch's inputs, named apart
            self.micro.append({n: f"{n}_micro{i}" for n in first})
            for n, tensor in zip(first, tensors):
                self._add(f"{n}_micro{i}", "input", tensor)
                self.inputs.append(f"{n}_micro{i}")

    def _input_labels(self) -> list[str]:
        """Each tensor input's name: the forward's parameter or the keyword, the loss function's second parameter
        for the target (`target` if it has none Python can read); `x_0`, `x_1` for the tensors inside one input."""
        model, loss_fn = self.step.model, self.step.loss_fn
        args, kwargs = split_inputs(self.step.inputs)
        names = positional_names(self.step.user.fn if self.step.user is not None else model.forward)
        if loss_fn is not None and self.step.loss_takes_target:
            names = [names[i] if i < len(names) else f"input_{i}" for i in range(len(args) - 1)]
            names.append((positional_names(loss_fn)[1:2] or ["target"])[0])
        if kwargs and self.ep.call_spec.in_spec is not None:
            kwargs = reorder_kwargs(kwargs, self.ep.call_spec.in_spec)
        labels = []
        for path, leaf in pytree.tree_flatten_with_path((args, kwargs))[0]:
            if not isinstance(leaf, torch.Tensor):
                continue
            top = path[1]
            base = top.key if isinstance(top, pytree.MappingKey) else (
                names[top.idx] if top.idx < len(names) else f"input_{top.idx}")
            rest = "_".join(re.sub(r"\W", "", str(getattr(p, "idx", getattr(p, "key", p)))) for p in path[2:])
            labels.append(f"{base}_{rest}" if rest else str(base))
        return labels

    def _plan_updates(self) -> None:
        """Each parameter the optimizer updates: its rule, hyperparameters and state (as the optimizer holds it, or
        fresh)."""
        optimizer = self.step.optimizer
        rule = rule_of(optimizer)
        by_tensor = {id(p): name for name, p in self.step.model.named_parameters()}  # training_step: all there
        names = {v.target: n for n, v in self.values.items() if v.kind == "parameter"}
        for g, group in enumerate(optimizer.param_groups):
            hyper = rule.hyper(group)
            held = [bool(optimizer.state.get(p)) for p in group["params"]]
            if len(set(held)) > 1:
                raise ProgramLoadError(f"the optimizer holds state for some parameters of its param group {g} and not "
                                       "for others (a parameter added after it stepped): Rewind runs a group whose "
                                       "parameters all start fresh, or all from the optimizer's state")
            numbers = {LR: [lrs[g] for lrs in self.step.learning_rates]}
            numbers.update(rule.step_numbers(hyper, not any(held), self.steps))
            named = {key: key if g == 0 else f"{key}_group{g}" for key in numbers}
            named[LR] = lr_name(g)
            self.numbers.update({named[key]: per_step for key, per_step in numbers.items()})
            for p in group["params"]:
                param = names.get(by_tensor[id(p)])
                if not p.requires_grad or param is None:
                    continue  # frozen (requires_grad=False), or not used by the loss at all
                state = {}
                for key, tensor in rule.state(p, optimizer.state.get(p, {}), hyper).items():
                    state[key] = f"{key}_{param}"
                    self._add(state[key], "buffer", tensor)
                self.updates[param] = _Update(rule.update, hyper, state, named)
        if not self.updates:
            raise ProgramLoadError("the optimizer updates no parameter of the module that requires a gradient")

    # -- the trace --------------------------------------------------------------------------------------------------
    def _make_fx(self) -> tuple[torch.fx.GraphModule, list[tuple[str, str]]]:
        """The traced step and its outputs' layout: (role, value name) per output, the role one of loss, grad (of
        the parameter named) and updated (the parameter, optimizer state or buffer named)."""
        scaling = self.step.scaling
        half = [p for p in self.updates if self.flat[p].dtype == torch.float16]
        if scaling is not None and half:
            raise ProgramLoadError(f"GradScaler unscales gradients in place of the optimizer, and '{half[0]}' is a "
                                   "float16 parameter, whose gradient GradScaler refuses to unscale (it would lose "
                                   "it): keep the parameters in float32 and run the forward in float16 under "
                                   "torch.autocast")
        if scaling is not None:
            self._add(SCALE, "buffer", scaling.scale)
            self._add(TRACKER, "buffer", scaling.tracker)
        self._add(RNG_STATE, "buffer", self.step.rng_state)
        names = list(self.flat)
        sig = self.ep.graph_signature
        mutated = [_placeholder_for(sig, s.target) for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
        layout: list[tuple[str, str]] = []

        where = StepWhere()
        random = _SeededRandom()

        def one_step(*flat: torch.Tensor) -> tuple:
            env = dict(zip(names, flat))
            random.state = env[RNG_STATE]
            trained = list(self.updates)
            losses, grads = [], None
            for micro in [{}] + self.micro:  # each micro-batch's forward and backward; its gradients summed
                where.phase = "forward"
                outs = _Forward(self.ep.graph_module, where).run(*(env[micro.get(n, n)] for n in self.order))
                env.update((self.order[buf], out) for buf, out in zip(mutated, outs))  # the next reads them
                losses.append(outs[len(mutated)])
                scaled = losses[-1] if scaling is None else scaling.scaled(losses[-1], env[SCALE])
                _tag_backward(scaled, where)
                where.phase = "backward"
                with fx_traceback.annotate({_PHASE: "backward"}):
                    more = torch.autograd.grad(scaled, [env[p] for p in trained], allow_unused=True)
                    grads = more if grads is None else [_summed(a, b) for a, b in zip(grads, more)]
            loss = losses[0] if len(losses) == 1 else sum(losses[1:], losses[0])  # what a loop logs: their sum
            layout[:] = [("loss", "loss")]
            results = [loss]
            where.phase = "optimizer"
            with torch.no_grad(), fx_traceback.annotate({_PHASE: "optimizer"}):
                found = None
                if scaling is not None:  # scaler.unscale_(optimizer)
                    with fx_traceback.annotate({_CALL: "unscale"}):
                        grads, found = scaling.unscaled(list(grads), env[SCALE])
                    layout.append(("named", FOUND_INF))
                    results.append(found)
                if self.step.clip_grad_norm is not None:
                    with fx_traceback.annotate({_CALL: "clip"}):
                        grads = _clipped(grads, self.step.clip_grad_norm)
                with fx_traceback.annotate({_CALL: "update"}):
                    numbers = {}
                    for name, per_step in self.numbers.items():
                        numbers[name] = torch.scalar_tensor(per_step[0], dtype=torch.float64)
                        layout.append(("named", name))
                        results.append(numbers[name])
                    for param, grad in zip(trained, grads):
                        if grad is None:
                            continue  # a parameter the loss does not depend on: as torch.optim, left as it is
                        update = self.updates[param]
                        layout.append(("grad", param))
                        results.append(grad)
                        state = {key: env[name] for key, name in update.state.items()}
                        taken = {key: numbers[name] for key, name in update.numbers.items()}
                        for key, tensor in update.rule(env[param], grad, state, update.hyper, taken).items():
                            name = update.state.get(key, param)
                            layout.append(("updated", name))
                            results.append(tensor if found is None else scaling.held(found, env[name], tensor))
                if scaling is not None:  # scaler.update()
                    with fx_traceback.annotate({_CALL: "scaler_update"}):
                        updated = scaling.updated(env[SCALE], env[TRACKER], found)
                    for name, tensor in zip((SCALE, TRACKER), updated):
                        layout.append(("updated", name))
                        results.append(tensor)
            for buf in mutated:
                layout.append(("updated", self.order[buf]))
                results.append(env[self.order[buf]])
            if random.drew:
                layout.append(("updated", RNG_STATE))
                results.append(random.state)
            return tuple(results)

        flat = [t.clone().requires_grad_(n in self.updates) for n, t in self.flat.items()]
        self._carry_gradient_hooks(dict(zip(self.flat, flat)))
        ranked = torch.distributed.is_available() and torch.distributed.is_initialized()
        # The Python dispatcher runs an op's traceable decomposition where torch has one (one_hot's compares with
        # an arange; its eager kernel reads the labels' values to check them), as torch.export and AOTAutograd do.
        try:
            with fx_traceback.preserve_node_meta(), enable_python_dispatcher(), random, \
                    _CollectivesNotRun() if ranked else contextlib.nullcontext():
                gm = make_fx(one_step)(*flat)
        except ProgramLoadError:
            raise
        except Exception as exc:  # torch's words and stack are the trace's, not the user's: told in theirs
            raise ProgramLoadError(f"the training step cannot be traced: {step_failure(exc, where)}") from None
        if not any(role == "grad" for role, _ in layout):
            raise ProgramLoadError("the loss does not depend on any parameter the optimizer updates")
        _out_of_place(gm.graph)
        if not random.drew:  # the last traced input, read by no node: no value of the Program
            del self.flat[RNG_STATE], self.values[RNG_STATE]
        return gm, layout

    def _carry_gradient_hooks(self, traced: dict[str, torch.Tensor]) -> None:
        """The hooks the user registered on a parameter (Tensor.register_hook: a data-parallel model's gradient
        all_reduce) run on its gradient in the trace, as torch.autograd runs them: their ops are backward nodes."""
        params = dict(self.step.model.named_parameters())
        for name in self.updates:
            for hook in (getattr(params[self.values[name].target], "_backward_hooks", None) or {}).values():
                traced[name].register_hook(_traced_hook(hook))

    # -- the traced graph as Nodes ----------------------------------------------------------------------------------
    def _names(self, gm: torch.fx.GraphModule, layout: list[tuple[str, str]]) -> tuple[dict, dict, dict]:
        """(fx name -> value name, updated value -> its update, parameter -> its gradient): the traced inputs by
        their values' names, the loss, gradients and updates by theirs, and a node torch named as one of those
        renamed apart."""
        graph_nodes = list(gm.graph.nodes)
        placeholders = [n for n in graph_nodes if n.op == "placeholder"]
        rename = {fx.name: name for fx, name in zip(placeholders, self.flat)}
        updates: dict[str, str] = {}
        gradients: dict[str, str] = {}
        for (role, name), fx in zip(layout, graph_nodes[-1].args[0]):
            new = {"loss": "loss", "grad": f"grad_{name}", "updated": f"{name}_updated", "named": name}[role]
            if not isinstance(fx, torch.fx.Node) or fx.op != "call_function" or fx.name in rename:
                raise ProgramLoadError(f"the training step's {role} '{new}' is not a value a node computes")
            rename[fx.name] = new
            if role == "grad":
                gradients[name] = new
            elif role == "updated":
                updates[name] = new
        ours = set(rename.values())
        taken = ours | {n.name for n in graph_nodes}
        for fx in graph_nodes:
            if fx.name not in rename and fx.name in ours:
                rename[fx.name] = next(f"{fx.name}_{i}" for i in itertools.count(1) if f"{fx.name}_{i}" not in taken)
                taken.add(rename[fx.name])
        return rename, updates, gradients

    def _convert(self, gm: torch.fx.GraphModule, layout: list[tuple[str, str]]) -> _OneStep:
        rename, updates, gradients = self._names(gm, layout)
        named = {name for role, name in layout if role == "named"}
        values, initial = dict(self.values), dict(self.flat)
        nodes: list[Node] = []
        getitem_of: dict[str, list] = {}
        forward_of_seq: dict[int, int] = {}
        backward_names: dict[str, int] = {}
        for fx in gm.graph.nodes:
            if fx.op == "get_attr":  # a tensor the trace made (a constant)
                tensor, name = getattr(gm, fx.target), rename.get(fx.name, fx.name)
                values[name] = ValueInfo(name, "constant", dtype_name(tensor.dtype), tuple(tensor.shape))
                initial[name] = tensor.detach()
                continue
            if fx.op != "call_function":
                continue
            op_name = str(fx.target)
            if op_name in _ALIASES:
                rename[fx.name] = _value_name(fx.args[0], getitem_of, rename)
                continue
            _refuse_random(fx)
            custom = fx.meta.get("custom") or {}
            phase = custom.get(_PHASE, "forward")
            hooked = custom.get(_HOOK, False)  # a gradient hook's op differentiates no forward op: at the hook's line
            forward = forward_of_seq.get(fx.meta.get("seq_nr", -1)) if phase == "backward" and not hooked else None
            name = rename[fx.name] if rename.get(fx.name) in named else fx.name  # lr, found_inf: as their values
            if phase == "backward":
                name = _name_backward(fx, nodes[forward].name if forward is not None else fx.name, backward_names,
                                      rename)
            stack = _unwrapped_stack(fx.meta.get("nn_module_stack") or {}) if phase == "forward" else {}
            converted = convert_node(fx, len(nodes), getitem_of, rename, stack)
            if converted is None:
                continue
            node, written = converted
            if phase == "forward":
                forward_of_seq.setdefault(fx.meta.get("seq_nr", -1), node.index)
            elif forward is not None:
                source = nodes[forward]
                node = replace(node, loc=source.loc, frames=source.frames, module_stack=source.module_stack)
            elif phase == "optimizer" and self.step.user is not None and custom.get(_CALL) in self.step.user.sites:
                frames = self.step.user.sites[custom[_CALL]]  # the user's own opt.step(), clip_grad_norm_(), ...
                node = replace(node, loc=frames[-1].loc if frames else None, frames=frames)
            nodes.append(replace(node, name=name, phase=phase, differentiates=forward))
            values.update(written)
        return _OneStep(nodes, values, initial, self.inputs, updates, gradients, "loss", self.numbers)


def _summed(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient accumulated over micro-batches, as `.grad` accumulates over backward() calls."""
    return b if a is None else a if b is None else a + b


def _clipped(grads: list, max_norm: float) -> list:
    """torch.nn.utils.clip_grad_norm_(parameters, max_norm) on the gradients, functional: each times
    min(max_norm / (total norm + 1e-6), 1)."""
    present = [g for g in grads if g is not None]
    total = torch.nn.utils.get_total_norm(present, 2.0, foreach=False)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [None if g is None else g.mul(coefficient) for g in grads]


def _out_of_place(graph: torch.fx.Graph) -> None:
    """The in-place ops autograd's formulas run on tensors of their own (vector_norm's backward fills a quotient it
    made with masked_fill_) as their out-of-place twins, the nodes after them reading the result: a Program's values
    are written once. An in-place op on anything else (a traced input, a view) is left for convert_node to refuse."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for fx in list(graph.nodes):
        functional = _functional_twin(fx)
        written = fx.args[0] if functional is not None else None
        if not isinstance(written, torch.fx.Node) or written.op != "call_function" or _aliases(written) \
                or any(_aliases(u) for u in written.users if order[u] < order[fx]):  # a view sees the write too
            continue
        fx.target = functional
        for user in [u for u in written.users if order[u] > order[fx]]:
            user.replace_input_with(written, fx)


def _functional_twin(fx: torch.fx.Node) -> torch._ops.OpOverload | None:
    """aten.masked_fill.Scalar for a node of aten.masked_fill_.Scalar: an op writing its first argument alone."""
    op = fx.target
    if not isinstance(op, torch._ops.OpOverload) or not op._schema.is_mutable or not fx.args:
        return None
    writes = [bool(a.alias_info and a.alias_info.is_write) for a in op._schema.arguments]
    name = op._schema.name.split("::")[-1]
    if writes[:1] != [True] or any(writes[1:]) or not name.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    return getattr(packet, op._overloadname, None)


def _aliases(fx: torch.fx.Node) -> bool:
    """Does the node's output alias another tensor (a view, or an in-place op's own result)?"""
    op = fx.target
    return not isinstance(op, torch._ops.OpOverload) or any(r.alias_info is not None for r in op._schema.returns)


def _name_backward(fx: torch.fx.Node, forward: str, taken: dict[str, int], rename: dict[str, str]) -> str:
    """A backward node is named after the forward node it differentiates (`_softmax_backward`, `_softmax_backward_1`),
    and so is what it writes unless that is a gradient or an update, named already."""
    count = taken.get(forward, 0)
    taken[forward] = count + 1
    name = f"{forward}_backward" + (f"_{count}" if count else "")
    rename.setdefault(fx.name, name)
    for user in fx.users:
        if user.target is operator.getitem:
            rename.setdefault(user.name, f"{name}_{user.args[1]}")
    return name


def _value_name(arg: torch.fx.Node, getitem_of: dict[str, list], rename: dict[str, str]) -> str:
    if arg.target is operator.getitem:
        return getitem_of[arg.args[0].name][arg.args[1]]
    return rename.get(arg.name, arg.name)


def _check_loss(ep: ExportedProgram) -> None:
    """The loss is one floating-point number."""
    name = next(s.arg.name for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT)
    loss = next(n for n in ep.graph.nodes if n.name == name).meta.get("val")
    if not isinstance(loss, torch.Tensor) or loss.shape != () or not loss.dtype.is_floating_point:
        got = _tensor_kind(loss) if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
        raise ProgramLoadError(f"the loss must be one floating-point number (a 0-dim tensor); the training step's is "
                               f"{got}: reduce it (.mean(), .sum())")


def _refuse_random(fx: torch.fx.Node) -> None:
    """A node drawing random numbers from a generator Rewind does not thread through the Program (an op with no
    seeded twin, hardware/random_ops.py) cannot be replayed bit for bit."""
    if isinstance(fx.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in fx.target.tags \
            and not _no_dropout(fx):
        raise ProgramLoadError(f"the training step draws random numbers with {fx.target.overloadpacket.__name__}, "
                               "which stepping back cannot replay; Rewind replays "
                               f"{', '.join(sorted({op.overloadpacket.__name__ for op in RANDOM_OPS}))} (dropout "
                               "included): draw with one of those, or make the numbers an input of the step")


def _no_dropout(fx: torch.fx.Node) -> bool:
    """An op that draws only for its dropout (scaled_dot_product_attention's kernels), given a dropout of 0: it
    draws nothing."""
    names = [a.name for a in fx.target._schema.arguments]
    if "dropout_p" not in names:
        return False
    at = names.index("dropout_p")
    p = fx.kwargs.get("dropout_p", fx.args[at] if at < len(fx.args) else 0.0)
    return isinstance(p, (int, float)) and p == 0


def _user_op(ep: ExportedProgram, placeholder: str) -> str:
    """The op of the first node that reads an input of the exported graph (`bernoulli`)."""
    node = next(n for n in ep.graph.nodes if n.name == placeholder)
    target = next((u.target for u in node.users), None)
    return getattr(getattr(target, "overloadpacket", None), "__name__", "a random op")


_OWN_GENERATOR = ("the training step draws random numbers with {op} from a torch.Generator of its own, which Rewind "
                  "cannot replay: draw from torch's default generator (torch.manual_seed in train_step() seeds it)")


class _SeededRandom(TorchDispatchMode):
    """Above make_fx's tracer: each random op runs as its seeded twin (hardware/random_ops.py), from the generator
    state `state` (a traced value, `rng_state`), which it then replaces with the state after the draw. An op given
    its own torch.Generator is refused: its state is not the one threaded."""

    def __init__(self) -> None:
        super().__init__()
        self.state: torch.Tensor | None = None
        self.drew = False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        twin = seeded(func)
        if twin is None:
            return func(*args, **kwargs)
        if kwargs.pop("generator", None) is not None:
            raise ProgramLoadError(_OWN_GENERATOR.format(op=func.overloadpacket.__name__))
        *outs, self.state = twin(self.state, draw_dtype(args, kwargs), *args, **kwargs)
        self.drew = True
        return outs[0] if len(outs) == 1 else tuple(outs)


class _Forward(torch.fx.Interpreter):
    """The exported module-and-loss run under the trace, telling `where` which node runs (a failure names its
    line) and which node made each autograd node (a failing gradient names the line it differentiates)."""

    def __init__(self, gm: torch.fx.GraphModule, where: StepWhere):
        super().__init__(gm)
        self.where = where

    def run_node(self, n: torch.fx.Node) -> Any:
        self.where.running = n
        result = super().run_node(n)
        self.where.ran(n, result)
        return result


def _tag_backward(loss: torch.Tensor, where: StepWhere) -> None:
    """Make each backward op the trace records carry the sequence number of the forward op it differentiates: a
    hook on every autograd node of the loss's graph says which node runs (torch's AOTAutograd does the same), and
    tells `where`."""
    seen: set = set()
    todo = [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        seq = fn._sequence_nr()
        fn.register_prehook(lambda _grads, seq=seq: _differentiating(seq, where))
        fn.register_hook(lambda _inputs, _outputs: fx_traceback.reset_grad_fn_seq_nr())
        todo.extend(f for f, _ in fn.next_functions)


def _differentiating(seq: int, where: StepWhere) -> None:
    where.differentiating = seq
    fx_traceback.set_grad_fn_seq_nr(seq)


def _traced_hook(hook: Callable) -> Callable:
    """A gradient hook as the trace runs it: its nodes marked as a hook's, with the stack that names its lines."""

    def traced(grad: torch.Tensor) -> Any:
        tracer = get_proxy_mode().tracer
        tracer.record_stack_traces = True  # only here: the backward's other nodes take their forward node's lines
        tracer._filter_traceback_frames = _inside_hook  # torch keeps the frames inside a forward; a hook has none
        try:
            with fx_traceback.annotate({_HOOK: True}):
                return hook(grad)
        finally:
            tracer.record_stack_traces = False
            del tracer._filter_traceback_frames

    return traced


def _inside_hook(stack: traceback.StackSummary) -> traceback.StackSummary:
    """The frames of a stack inside a traced hook's call."""
    calls = [i for i, frame in enumerate(stack) if frame.filename == __file__ and frame.name == "traced"]
    return traceback.StackSummary.from_list(stack[calls[-1] + 1:] if calls else stack)


class _CollectivesNotRun(TorchDispatchMode):
    """Above make_fx's tracer while one rank of many traces its step: a collective (a gradient hook's all_reduce) is
    recorded as a node but not run, so a rank loads on its own and a collective runs only when every rank is let
    through it (hardware/ranks/). Zeros of its result's shape stand in: the trace's values are thrown away. (The
    node is made as torch's higher-order ops make theirs.)"""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not str(func).startswith(COLLECTIVE_NAMESPACE):
            return func(*args, **kwargs)
        with disable_proxy_modes_tracing() as tracing:  # what runs here is not traced
            meta_args, meta_kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), (args, kwargs))
            stand_in = pytree.tree_map_only(torch.Tensor, lambda m: torch.zeros(m.shape, dtype=m.dtype),
                                            func(*meta_args, **meta_kwargs))
            proxy_args, proxy_kwargs = pytree.tree_map(tracing.tracer.unwrap_proxy, (args, kwargs))
            proxy = tracing.tracer.create_proxy("call_function", func, proxy_args, proxy_kwargs,
                                                name=func.overloadpacket.__name__)
            return track_tensor_tree(stand_in, proxy, constant=None, tracer=tracing.tracer)


def _unwrapped_path(path: str) -> str:
    """A module path of the exported module as the user's module has it (`l1` for `model.l1`)."""
    if path == _WRAPPED:
        return ""
    return path.removeprefix(_WRAPPED + ".")


def _unwrapped_stack(stack: dict) -> dict:
    """An nn_module_stack without the exported wrapper: the user's module is the root."""
    return {key: (_unwrapped_path(path), cls) for key, (path, cls) in stack.items() if path}


def _placeholder_for(sig: Any, target: str) -> int:
    return next(i for i, s in enumerate(sig.input_specs) if s.target == target)
