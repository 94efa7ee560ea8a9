"""A training step as the user wrote it: their own function calling `loss.backward()`, `clip_grad_norm_`,
`opt.step()` and `zero_grad()`, read as it runs under torch.export.

A file gives its step in either of two ways:
- `train_step()` returns `(step, inputs)`: `step(*inputs)` (or `step(**inputs)` for a dict) is one training step;
- `train_step(x, y)` is itself the step (it takes the batch, and the model and optimizer it trains are variables
  of the file or of what it closes over): the file's `batches()` yields its inputs, the first batch the one it is
  exported for.

The model, optimizer, GradScaler and learning-rate schedulers are found among what the step reaches (the
variables it closes over, the globals it names, their attributes one level down): one optimizer; the module is the
outermost one holding every parameter the optimizer updates.

The step's Python runs once, under torch.export, with its tensors fake. The calls that train are read rather than
run, in the order the step makes them:
- `loss.backward()` (`torch.autograd.backward(loss)`): the loss, a 0-dim float; several (the step's own
  micro-batches) sum, as `.grad` sums them, and the step's `loss` is that sum, its node at the line of the
  backward that adds it. A `zero_grad()` between a backward and the update drops what came before it, as it drops
  those gradients.
- `torch.nn.utils.clip_grad_norm_(parameters, max_norm)` of the trained parameters, after the last backward (and
  the scaler's unscale_): the Program clips the gradients (torch_train's clip_grad_norm). What it returns, the
  total norm, is computed later than the step's Python runs, so reading it there is refused in words.
- `opt.step()`, once, or `scaler.step(opt)` with a GradScaler (`scaler.scale(loss).backward()`,
  `scaler.unscale_(opt)`, `scaler.update()`); then a scheduler's `step()`.
- `opt.zero_grad()` or `model.zero_grad()`: a step of many that never clears the gradients would add each step's
  to the last one's, which Rewind's steps (each from no gradients) do not do: refused.
The Program is then the one a `(module, inputs, optimizer, ...)` train_step() gives (torch_train.py): forward
(the step's Python, at its lines), backward and update nodes. What the step returns is not used.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.fx.traceback as fx_traceback

from hardware.errors import ProgramLoadError, echo, raised_in_user_code
from hardware.frontends.torch_export import _is_user_file
from hardware.program import Frame, SourceLoc

_MISSING = object()


def is_step_function(fn: Any) -> bool:
    """A function the user wrote, not a module or an optimizer: a step of their own."""
    return inspect.isfunction(fn) or inspect.ismethod(fn)


def takes_a_batch(fn: Any) -> bool:
    """Is the entry itself a step, taking the batch (`train_step(x, y)`)? It has a required positional parameter
    other than the rank arguments a builder of one rank takes."""
    if not is_step_function(fn):
        return False
    try:
        return any(name not in ("rank", "world_size") for name in _required(fn))
    except (TypeError, ValueError):  # a signature Python cannot read
        return False


@dataclass
class UserStep:
    """The user's step function, the objects it trains with, and what a run of it under export did."""

    fn: Callable
    where: str  # "train_step() in model.py": how messages name the step
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any = None  # a torch.amp.GradScaler the step reaches
    schedulers: list = field(default_factory=list)  # the schedulers of the optimizer the step reaches
    # What the run did (read by torch_train after the export):
    clip_grad_norm: float | None = None
    scaled: bool = False  # scaler.scale(loss).backward(): the scaler's step
    scheduler: Any = None  # the scheduler the step stepped
    cleared: bool = False  # a zero_grad() ran
    # Where the step made each call of its update (unscale, clip, update, scaler_update), the user's frames outermost first: the update's nodes
    # are at those lines (a breakpoint on `opt.step()` stops in the update).
    sites: dict[str, tuple[Frame, ...]] = field(default_factory=dict)
    # The module's parameters by name, and those the optimizer trains, as they are outside export (inside, the
    # module holds stand-ins).
    real_names: dict[int, str] = field(default_factory=dict)
    trained_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.real_names = {id(p): n for n, p in self.model.named_parameters()}
        trained = {id(p) for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad}
        self.trained_names = [n for n, p in self.model.named_parameters() if id(p) in trained]

    @classmethod
    def of(cls, fn: Callable, where: str) -> "UserStep":
        found = _reached(fn)
        optimizers = _unique(o for o in found if isinstance(o, torch.optim.Optimizer))
        if not optimizers:
            raise ProgramLoadError(f"the step {where} reaches no torch.optim optimizer: it trains with one it closes "
                                   "over or a variable of its file names (opt = torch.optim.AdamW(...))")
        if len(optimizers) > 1:
            raise ProgramLoadError(f"the step {where} reaches {len(optimizers)} optimizers; Rewind traces a step of "
                                   "one")
        optimizer = optimizers[0]
        trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
        covering = _unique(m for m in found if isinstance(m, torch.nn.Module)
                           and trained <= {id(p) for p in m.parameters()})
        outer = [m for m in covering if not any(m is not o and any(m is s for s in o.modules()) for o in covering)]
        if not outer:
            raise ProgramLoadError(f"no module the step {where} reaches holds the parameters its optimizer updates "
                                   "(the model, a variable of the file or one the step closes over)")
        if len(outer) > 1:
            raise ProgramLoadError(f"the step {where} reaches {len(outer)} modules that each hold the parameters its "
                                   "optimizer updates; Rewind traces a step of one model")
        scalers = _unique(o for o in found if isinstance(o, torch.amp.GradScaler))
        if len(scalers) > 1:
            raise ProgramLoadError(f"the step {where} reaches {len(scalers)} GradScalers; a step takes one")
        schedulers = _unique(o for o in found if isinstance(o, torch.optim.lr_scheduler.LRScheduler)
                             and getattr(o, "optimizer", None) is optimizer)
        return cls(fn, where, outer[0], optimizer, scalers[0] if scalers else None, schedulers)

    @property
    def wrapped(self) -> Callable:
        # Export keeps the frames of forward methods, and of functions annotated: the step's lines are the user's.
        return fx_traceback.annotate_fn({})(self.fn)

    def run(self, args: tuple, kwargs: dict) -> torch.Tensor:
        """The step run once, its training calls read (under torch.export: the tensors are fake): the loss its
        backward() calls were given, summed."""
        run = _Run(self)
        with run.patched():
            self.wrapped(*args, **kwargs)
        return run.finished()

    def check_steps(self, steps: int) -> None:
        if steps > 1 and not self.cleared:
            raise ProgramLoadError(f"the step {self.where} never clears the gradients (opt.zero_grad() or "
                                   "model.zero_grad()), so each step's backward() would add to the one before it; "
                                   "Rewind's steps each start from no gradients: call opt.zero_grad() at the start "
                                   "of the step (or after opt.step())")


class _TotalNorm:
    """What clip_grad_norm_ returns inside a traced step: the total norm is computed after the backward, later
    than the step's Python runs, so any use of it says so."""

    def __init__(self, where: str):
        self._where = where

    def _refuse(self, *_: Any) -> Any:
        raise ProgramLoadError(f"the step {self._where} reads the total norm clip_grad_norm_ returns; the norm is "
                               "computed in the step's update, after its Python has run, so the step cannot read "
                               "it (it is the clipping's norm node in the update: stop there to see it)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        self._refuse()

    __format__ = __float__ = __bool__ = __repr__ = __str__ = __add__ = __radd__ = __mul__ = __lt__ = __gt__ = _refuse


class _Run:
    """One run of the step: its training calls replaced by ones that read them, in order."""

    def __init__(self, step: UserStep):
        self.step = step
        self.total: torch.Tensor | None = None
        self.events: list[str] = []
        self.scaled_ids: set[int] = set()
        step.clip_grad_norm, step.scaled, step.scheduler, step.cleared = None, False, None, False
        step.sites = {}

    def refuse(self, what: str) -> None:
        raise ProgramLoadError(f"the step {self.step.where} {what}")

    # -- the calls, read --------------------------------------------------------------------------------------------
    def backward(self, tensor: Any, gradient: Any = None, retain_graph: Any = None, create_graph: bool = False,
                 inputs: Any = None, **_: Any) -> None:
        if "step" in self.events:
            self.refuse("calls backward() after opt.step(); Rewind traces a step of one update: a forward and "
                        "backward (or several, summed), then the optimizer's step")
        if gradient is not None or inputs is not None or create_graph:
            self.refuse("calls backward() with a gradient, inputs or create_graph; Rewind traces the backward of a "
                        "loss (loss.backward())")
        if not isinstance(tensor, torch.Tensor) or tensor.shape != () or not tensor.dtype.is_floating_point:
            self.refuse("calls backward() on a tensor that is not a loss: the loss is one floating-point number (a "
                        "0-dim tensor), reduce it (.mean(), .sum())")
        if self.step.scaler is not None and self.scaled_ids and id(tensor) not in self.scaled_ids:
            self.refuse("scales some losses with its GradScaler and not others: every backward() takes "
                        "scaler.scale(loss)")
        self.events.append("backward")
        # The running total where the user's backward() is: its node is at their line.
        self.total = tensor if self.total is None else self.total + tensor

    def autograd_backward(self, tensors: Any, grad_tensors: Any = None, retain_graph: Any = None,
                          create_graph: bool = False, inputs: Any = None, **_: Any) -> None:
        if isinstance(tensors, (tuple, list)):
            if len(tensors) != 1:
                self.refuse("calls torch.autograd.backward() on several tensors; Rewind traces the backward of a "
                            "loss")
            tensors = tensors[0]
        self.backward(tensors, grad_tensors, retain_graph, create_graph, inputs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if "backward" in self.events and "step" not in self.events:
            self.total = None  # the gradients of the backwards before it are gone, their losses with them
            self.step.clip_grad_norm = None
        self.events.append("zero_grad")
        self.step.cleared = True

    def clip_grad_norm_(self, parameters: Any, max_norm: Any, norm_type: Any = 2.0,
                        error_if_nonfinite: bool = False, foreach: Any = None) -> _TotalNorm:
        if "backward" not in self.events or "step" in self.events:
            self.refuse("calls clip_grad_norm_ where there are no gradients to clip: between the backward() and "
                        "opt.step()")
        if self.step.scaled and "unscale" not in self.events:
            self.refuse("calls clip_grad_norm_ on the scaled gradients: call scaler.unscale_(opt) before it")
        if float(norm_type) != 2.0:
            self.refuse(f"clips the gradients' norm of type {echo(repr(norm_type))}; Rewind clips the 2-norm (the "
                        "default)")
        if error_if_nonfinite:
            self.refuse("calls clip_grad_norm_ with error_if_nonfinite=True, a check the traced step cannot make "
                        "while its Python runs: leave it False (a NaN/Inf gradient stops the debugger anyway)")
        number = isinstance(max_norm, (int, float)) and not isinstance(max_norm, bool)
        if not number or not math.isfinite(max_norm) or max_norm <= 0:
            self.refuse(f"clips the gradients to a norm of {echo(repr(max_norm))}; max_norm is a finite number above "
                        "0")
        self._check_clipped(parameters)
        if self.step.clip_grad_norm is not None:
            self.refuse("clips the gradients twice; Rewind clips them once, before the update")
        self.events.append("clip")
        self._site("clip")
        self.step.clip_grad_norm = float(max_norm)
        return _TotalNorm(self.step.where)

    def _check_clipped(self, parameters: Any) -> None:
        given = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        # Inside export the module's parameters are stand-ins: both them and the optimizer's are known by name.
        names = {id(p): n for n, p in self.step.model.named_parameters()}
        names.update(self.step.real_names)
        clipped = {names.get(id(p)) for p in given}
        trained = set(self.step.trained_names)
        if None in clipped or not trained <= clipped:
            self.refuse("clips the norm of some of the parameters, not of all the optimizer updates; Rewind clips "
                        "them all (clip_grad_norm_(model.parameters(), max_norm))")

    def opt_step(self, closure: Any = None) -> None:
        if closure is not None:
            self.refuse("calls opt.step(closure); Rewind traces an optimizer stepped without a closure")
        if self.step.scaled:
            self.refuse("calls opt.step() on gradients its GradScaler scaled: scaler.step(opt) unscales them first")
        self._stepped()

    def _stepped(self) -> None:
        if "step" in self.events:
            self.refuse("steps the optimizer twice; Rewind traces a step of one update")
        if "backward" not in self.events:
            self.refuse("steps the optimizer before any backward(): there are no gradients")
        self.events.append("step")
        self._site("update")

    def scale(self, outputs: Any) -> Any:
        if not isinstance(outputs, torch.Tensor):
            self.refuse("scales something other than the loss with its GradScaler")
        # The Program scales the loss itself (loss_scaling.py): what is returned is the loss, known as scaled.
        self.scaled_ids.add(id(outputs))
        self.step.scaled = True
        return outputs

    def unscale_(self, optimizer: Any) -> None:
        if optimizer is not self.step.optimizer:
            self.refuse("unscales another optimizer's gradients than the one it trains with")
        self.events.append("unscale")
        self._site("unscale")

    def scaler_step(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        if optimizer is not self.step.optimizer:
            self.refuse("steps another optimizer than the one it trains with")
        if not self.step.scaled:
            self.refuse("calls scaler.step(opt) with no scaler.scale(loss).backward() before it")
        self._stepped()

    def update(self, new_scale: Any = None) -> None:
        if new_scale is not None:
            self.refuse("sets the GradScaler's scale itself (scaler.update(new_scale)); Rewind's scaler grows and "
                        "backs off as torch's does")
        if "step" not in self.events:
            self.refuse("calls scaler.update() before scaler.step(opt)")
        self.events.append("scaler_update")
        self._site("scaler_update")

    def scheduler_step(self, scheduler: Any) -> Callable:
        def stepped(*args: Any, **kwargs: Any) -> None:
            if args or kwargs:
                self.refuse("steps its learning-rate scheduler with an argument; Rewind schedules by the step count")
            if "step" not in self.events:
                self.refuse("steps its learning-rate scheduler before opt.step(); a loop steps it after")
            if self.step.scheduler is not None:
                self.refuse("steps two learning-rate schedulers; a step takes one")
            self.step.scheduler = scheduler
        return stepped

    def _site(self, call: str) -> None:
        """The user's frames of the call being made, outermost first."""
        frames = []
        at = sys._getframe(1)
        while at is not None and at.f_code is not _RUN:  # the frames inside the step's call, not what launched it
            code = at.f_code
            if _is_user_file(code.co_filename):
                frames.append(Frame(SourceLoc(os.path.realpath(code.co_filename), at.f_lineno, code.co_name)))
            at = at.f_back
        self.step.sites[call] = tuple(reversed(frames))

    # -- the run ----------------------------------------------------------------------------------------------------
    def patched(self) -> "_Patches":
        step = self.step
        clip = torch.nn.utils.clip_grad_norm_
        targets: list[tuple[Any, str, Any]] = [
            (torch.Tensor, "backward", _method(self.backward)), (torch.autograd, "backward", self.autograd_backward),
            (torch.nn.utils, "clip_grad_norm_", self.clip_grad_norm_),
            (torch.nn.utils.clip_grad, "clip_grad_norm_", self.clip_grad_norm_),
            (step.optimizer, "step", self.opt_step), (step.optimizer, "zero_grad", self.zero_grad),
            (step.model, "zero_grad", self.zero_grad)]
        fn = step.fn.__func__ if inspect.ismethod(step.fn) else step.fn
        targets += [(fn.__globals__, name, self.clip_grad_norm_)
                    for name, value in list(fn.__globals__.items()) if value is clip]  # from torch.nn.utils import
        if step.scaler is not None:
            targets += [(step.scaler, "scale", self.scale), (step.scaler, "unscale_", self.unscale_),
                        (step.scaler, "step", self.scaler_step), (step.scaler, "update", self.update)]
        targets += [(s, "step", self.scheduler_step(s)) for s in step.schedulers]
        return _Patches(targets)

    def finished(self) -> torch.Tensor:
        if self.total is None:
            self.refuse("calls no backward() (after its last zero_grad()): a step computes a loss and calls "
                        "loss.backward()")
        if "step" not in self.events:
            self.refuse("never steps its optimizer (opt.step(), or scaler.step(opt) with a GradScaler)")
        if self.step.scaled and "scaler_update" not in self.events:
            self.refuse("never calls scaler.update(); Rewind's GradScaler step updates the scale as torch's loop "
                        "does")
        return self.total


def _method(fn: Callable) -> Callable:
    """`fn` as a function of a class: called on an instance, the instance first (a bound method set on a class is
    not bound again)."""
    def method(this: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(this, *args, **kwargs)
    return method


class _Patches:
    """Attributes (or a namespace's names: a function's globals) replaced for the run, then put back as they were
    (an instance's attribute removed again)."""

    def __init__(self, targets: list[tuple[Any, str, Any]]):
        self.targets = targets
        self.saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> None:
        try:
            for obj, name, new in self.targets:
                space = obj if isinstance(obj, dict) else vars(obj)
                self.saved.append((obj, name, space.get(name, _MISSING)))
                if isinstance(obj, dict):
                    obj[name] = new
                else:
                    setattr(obj, name, new)
        except BaseException:  # what was replaced before the failure is put back
            self.__exit__()
            raise

    def __exit__(self, *exc: Any) -> None:
        for obj, name, old in reversed(self.saved):
            if isinstance(obj, dict):
                obj.pop(name, None) if old is _MISSING else obj.__setitem__(name, old)
            elif old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        self.saved.clear()


def _reached(fn: Callable) -> list[Any]:
    """What a step function reaches: the variables it closes over, the globals its code names (and its nested
    functions' code), its defaults, its object when it is a method; and one level into any other object among
    those (a trainer's attributes)."""
    found: list[Any] = []
    if inspect.ismethod(fn):
        found.append(fn.__self__)
        fn = fn.__func__
    fn = inspect.unwrap(fn)
    found += [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c)]
    found += list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    names: set[str] = set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    found += [fn.__globals__[n] for n in sorted(names) if n in fn.__globals__]
    deeper = []
    for obj in found:
        if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor, type, types.ModuleType,
                            types.FunctionType, types.BuiltinFunctionType)) or not hasattr(obj, "__dict__"):
            continue
        deeper += [v for v in vars(obj).values()
                   if isinstance(v, (torch.nn.Module, torch.optim.Optimizer, torch.amp.GradScaler,
                                     torch.optim.lr_scheduler.LRScheduler))]
    return found + deeper


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a variable not yet assigned
        return False
    return True


def _unique(objects: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    for o in objects:
        seen.setdefault(id(o), o)
    return list(seen.values())


class BatchesOnce:
    """A file's batches() called once however often a load reads it: the batch a step that takes one is exported for
    is the first batch its steps then run, not the first of a second call (a generator drawing unseeded numbers, or
    reading a loader's iterator, would give another). Each call iterates what the one call yielded, in order, reading
    on where the earlier readers stopped; what it returns that is not iterable is returned as it is, to be refused."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn, self.called, self.result = fn, False, None
        self.seen: list[Any] = []
        self.source: Iterator[Any] | None = None

    def __call__(self) -> Any:
        if not self.called:
            self.result, self.called = self.fn(), True  # a call that raised is called again, to raise again
            if yields_batches(self.result):
                self.source = iter(self.result)
        return self.result if self.source is None else self._replayed()

    def _replayed(self) -> Iterator[Any]:
        k = 0
        while True:
            if k == len(self.seen):
                try:
                    self.seen.append(next(self.source))
                except StopIteration:
                    return
            yield self.seen[k]
            k += 1


def yields_batches(result: Any) -> bool:
    """Is what batches() returned something that yields batches (a generator, a list), not one batch itself?"""
    return not isinstance(result, (torch.Tensor, dict, str, bytes)) and hasattr(result, "__iter__")


def batches_once(module: types.ModuleType) -> None:
    """The module's batches() (when it has a callable one) is called once for the whole load (BatchesOnce)."""
    fn = getattr(module, "batches", None)
    if callable(fn) and not isinstance(fn, BatchesOnce):
        module.batches = BatchesOnce(fn)


def first_batch(module: types.ModuleType, fn_name: str, file: Path) -> Any:
    """The inputs a step that takes the batch is exported for: the first of the file's batches()."""
    fn = getattr(module, "batches", None)
    where = f"{fn_name}() in {file}"
    if not callable(fn):
        raise ProgramLoadError(f"{where} takes a batch ({', '.join(_required(getattr(module, fn_name)))}), so it is "
                               "the training step itself: the file's batches() yields its inputs (a generator of "
                               "tuples, one a step), and there is none")
    try:
        batches = fn()
        for batch in batches:
            return batch
    except ProgramLoadError:
        raise
    except Exception as exc:
        raise ProgramLoadError(f"calling batches() in {file} failed: {raised_in_user_code(exc, file)}") from exc
    raise ProgramLoadError(f"batches() in {file} yields no batch; {where} needs one")


def _required(fn: Callable) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]


_RUN = UserStep.run.__code__
