"""Random ops as functions of the generator's state: what makes dropout replayable bit for bit.

A random op (dropout in train mode, bernoulli, randn_like, multinomial, ...) draws from torch's generator, whose
state is hidden. Each one here has a `rewind::seeded_<op>` twin registered with torch's dispatcher: it takes the CPU
generator's state as its first input and returns the op's outputs and the state after the draw, so the state is a
value of the Program like any other, threaded from one random node to the next (hardware/frontends/torch_train.py
names it `rng_state`). Running the node again, in a replay, a recomputation or a reference pass, draws the same
numbers; patching `rng_state` draws others. The draw is the one eager torch makes with the same state (dropout's mask
equals `torch.manual_seed(s); F.dropout(x, p)`'s on the CPU), and it is made on the CPU whatever the device: a pass
on a GPU and its float64 reference on the CPU draw the same numbers. Imported for its registration.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.utils import _pytree as pytree

_aten = torch.ops.aten
RANDOM_OPS = (_aten.native_dropout.default, _aten.bernoulli.default, _aten.bernoulli.p, _aten.rand_like.default,
              _aten.randn_like.default, _aten.randint_like.default, _aten.multinomial.default,
              _aten.normal.Tensor_float, _aten.normal.Tensor_Tensor, _aten.uniform.default, _aten.exponential.default,
              _aten.rand.default, _aten.randn.default, _aten.randint.default, _aten.randperm.default)
_GENERATOR = re.compile(r",\s*\*,\s*Generator\? generator=None(?=\))|,\s*Generator\? generator=None")
_LIBRARY = torch.library.Library("rewind", "FRAGMENT")  # noqa: TOR901 (kept: the registrations live as long as it)
_SEEDED: dict[Any, Any] = {}  # aten overload -> its seeded twin


def seeded_name(op: torch._ops.OpOverload) -> str:
    """`seeded_native_dropout` for aten.native_dropout.default, `seeded_bernoulli_p` for aten.bernoulli.p."""
    packet = op._schema.name.split("::", 1)[1]
    return f"seeded_{packet}" + (f"_{op._overloadname}" if op._overloadname != "default" else "")


def _schema(op: torch._ops.OpOverload) -> str:
    """The twin's schema: the op's, after the generator's state and the dtype it draws in, the state after the draw
    last among the returns, no generator argument (the state is the generator)."""
    text = _GENERATOR.sub("", str(op._schema).split("(", 1)[1])
    arguments, returns = text.rsplit(" -> ", 1)
    returns = returns.strip("()")
    return f"{seeded_name(op)}(Tensor rng_state, str draw_dtype, {arguments} -> ({returns}, Tensor)"


def draw_dtype(args: tuple, kwargs: dict) -> str:
    """The dtype a random op draws in as traced (the numbers drawn depend on it): its dtype argument, else its first
    floating-point input's, else torch's default."""
    asked = kwargs.get("dtype") if isinstance(kwargs.get("dtype"), torch.dtype) else _floating_input(args)
    return str(asked or torch.get_default_dtype()).removeprefix("torch.")


def _floating_input(args: Any) -> torch.dtype | None:
    return next((t.dtype for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor) and t.is_floating_point()),
                None)


def _drawn(op: torch._ops.OpOverload, rng_state: torch.Tensor, draw: str, args: tuple, kwargs: dict) -> tuple:
    """The op run on the CPU from the generator state `rng_state`, drawing in the dtype `draw` whatever dtype a pass
    runs it at (a float64 reference draws the float32 numbers of the pass it checks), its outputs moved and cast to
    where and what they were asked in; and the state after it. The process's own generator is left as it was."""
    device = kwargs.get("device") or next((t.device for t in pytree.tree_leaves((args, kwargs))
                                           if isinstance(t, torch.Tensor)), torch.device("cpu"))
    asked = kwargs.get("dtype") if isinstance(kwargs.get("dtype"), torch.dtype) else _floating_input(args)
    drawing = getattr(torch, draw)
    cast = (lambda t: t.cpu().to(drawing) if t.is_floating_point() else t.cpu()) if drawing.is_floating_point \
        else (lambda t: t.cpu())
    on_cpu_args, on_cpu_kwargs = pytree.tree_map_only(torch.Tensor, cast, (args, kwargs))
    if "device" in kwargs:
        on_cpu_kwargs["device"] = torch.device("cpu")
    if isinstance(kwargs.get("dtype"), torch.dtype) and kwargs["dtype"].is_floating_point:
        on_cpu_kwargs["dtype"] = drawing
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(rng_state.detach().cpu())
        out = op(*on_cpu_args, **on_cpu_kwargs)
        after = torch.get_rng_state().to(rng_state.device)
    outs = list(out) if isinstance(out, tuple) else [out]
    if op is _aten.native_dropout.default and asked is not None and asked != drawing:
        outs[0] = _dropped(args[0].cpu(), outs[1], args[1])  # the mask drawn, applied at the input's precision
    return (*(_as_asked(o, asked).to(device) for o in outs), after)


def _dropped(x: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """native_dropout's output from its mask (aten/src/ATen/native/Dropout.cpp)."""
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return x.mul(mask).mul_(scale)


def _as_asked(t: torch.Tensor, asked: torch.dtype | None) -> torch.Tensor:
    return t.to(asked) if asked is not None and t.is_floating_point() else t


def _register(op: torch._ops.OpOverload) -> None:
    name = seeded_name(op)
    _LIBRARY.define(_schema(op))
    _LIBRARY.impl(name, lambda rng_state, draw, *args, **kwargs: _drawn(op, rng_state, draw, args, kwargs),
                  "CompositeExplicitAutograd")
    _LIBRARY.impl(name, lambda rng_state, draw, *args, **kwargs: (*_shapes(op, args, kwargs),
                                                                  torch.empty_like(rng_state)), "Meta")
    _SEEDED[op] = getattr(torch.ops.rewind, name).default


def _shapes(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple:
    out = op(*args, **kwargs)
    return out if isinstance(out, tuple) else (out,)


def seeded(op: Any) -> Any:
    """The seeded twin of a random aten op (None for an op that is not one of RANDOM_OPS)."""
    return _SEEDED.get(op)


for _op in RANDOM_OPS:
    _register(_op)
