"""The failure patterns of a training step (provenance/patterns.py's registry): a gradient NaN or infinite where
the forward is finite, a gradient flushed to zero in float16, gradients that explode over the steps, an
optimizer's epsilon that its dtype cannot hold, and a step torch.amp.GradScaler skipped because its gradients
overflowed. Tried before the general patterns in a training Program: a NaN in
the backward of a log is a gradient's failure before it is a division by zero.

Each rule reads what the forward node of a backward node did (provenance/steps.py: the Program says which forward
node each backward node differentiates), or the parameters' updates step by step.
"""

from __future__ import annotations

import torch

from hardware.errors import RewindError
from hardware.frontends.loss_scaling import FOUND_INF, SCALE
from hardware.optimizer_ops import ADAM_UPDATE, adam_argument
from hardware.program import Node
from provenance.patterns import LOW_PRECISION, Evidence, pattern, times
from provenance.steps import EXPLODING_UPDATE, gradient_norms, op_name, update_ratios

# A gradient underflowed when at least this share of the elements the reference holds below the dtype's smallest
# normal number (but not at 0) are 0 in this pass.
FLUSHED_SHARE = 0.5


def _forward(ev: Evidence) -> Node | None:
    """The forward node a backward node differentiates, when the rules can read its values."""
    if ev.program is None or ev.recorded is None or ev.node.phase != "backward":
        return None
    return ev.program.forward_node(ev.node)


@pattern("nan-gradient-through-where", "a NaN gradient through a masked `where`",
         "make the discarded elements safe before the op, not only after it (the double where): "
         "torch.where(x > 0, torch.log(torch.where(x > 0, x, 1)), 0): the backward then differentiates the log at 1, "
         "and the outer where passes 0 back there", training=True)
def _nan_gradient_through_where(ev: Evidence) -> str | None:
    forward = _forward(ev)
    if forward is None or not ev.output.isnan().any():
        return None
    value = forward.outputs[0]
    bad = int((~torch.isfinite(ev.recorded(value))).sum())
    masks = [n for n in ev.program.nodes if n.phase == "forward" and n.op_short == "aten.where"
             and value in n.input_names()]
    if not bad or not masks:
        return None
    return (f"the forward's `{op_name(forward)}` is NaN/Inf at {bad} element(s) of '{value}', which `where` "
            f"('{masks[0].name}') discards, but the backward still differentiates `{op_name(forward)}` there: its "
            "gradient at those elements, times the 0 the `where` passes back, is NaN")


@pattern("sqrt-at-zero-gradient", "an infinite gradient of sqrt at zero",
         "keep the root's argument away from 0: torch.sqrt(x + eps) (a norm as torch.sqrt((x * x).sum(dim) + eps)): "
         "its gradient, 1 / (2 sqrt(x)), is then finite where x is 0", training=True)
def _sqrt_at_zero_gradient(ev: Evidence) -> str | None:
    forward = _forward(ev)
    if forward is None or forward.op_short != "aten.sqrt" or bool(torch.isfinite(ev.output).all()):
        return None
    value = forward.outputs[0]
    zeros = int((ev.recorded(value) == 0).sum())
    if not zeros:
        return None
    made = "NaN" if ev.output.isnan().any() else "Inf"
    return (f"the forward's `{op_name(forward)}` is 0 at {zeros} element(s) of '{value}': its gradient there is "
            f"infinite (1 / (2 sqrt(0))), and this backward op makes {made} of it")


@pattern("gradient-underflow", "a gradient flushed to zero in low precision",
         "scale the loss before the backward and unscale the gradients before the optimizer (loss scaling, "
         "torch.amp.GradScaler): the gradients' small terms then stay above the dtype's smallest number",
         training=True)
def _gradient_underflow(ev: Evidence) -> str | None:
    if ev.node.phase != "backward" or ev.kind != "divergence" or ev.dtype not in LOW_PRECISION or \
            ev.reference is None or ev.program is None:
        return None
    tiny = torch.finfo(getattr(torch, ev.dtype)).tiny
    for name, mine in ev.inputs.items():
        if not mine.is_floating_point() or ev.program.values[name].producer is None:
            continue
        ref = ev.reference(name).double()
        small = (ref != 0) & (ref.abs() < tiny)
        flushed = small & (mine == 0)
        held = int((ref != 0).sum())
        if held and int(flushed.sum()) >= FLUSHED_SHARE * held:
            sizes = ref[flushed].abs()
            return (f"'{name}', a gradient this backward op reads, is 0 in {int(flushed.sum())} of {mine.numel()} "
                    f"element(s) where the reference's are {float(sizes.min()):.3g} to {float(sizes.max()):.3g}, "
                    f"below {ev.dtype}'s smallest normal number ({tiny:.3g}): the gradient underflowed to zero")
    return None


@pattern("exploding-gradients", "exploding gradients",
         "clip the gradients' norm before the optimizer (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) "
         "after backward()), or lower the learning rate", training=True)
def _exploding_gradients(ev: Evidence) -> str | None:
    if ev.kind != "nonfinite" or ev.program is None or ev.recorded is None or ev.node.step < 1:
        return None
    ratios = update_ratios(ev.program, ev.recorded, ev.node.step)
    step = next((k for k, r in enumerate(ratios) if r > EXPLODING_UPDATE), None)
    if step is None:
        return None
    norms = gradient_norms(ev.program, ev.recorded, step + 1)
    return (f"step {step}'s update moved the parameters by {times(ratios[step])} their own size (the gradients' "
            f"norm step by step: {', '.join(f'{n:.3g}' for n in norms)}): the gradients exploded, and step "
            f"{ev.node.step} overflows")


@pattern("adam-epsilon-underflow", "an optimizer epsilon its dtype cannot hold",
         "give the optimizer an epsilon the dtype holds (eps=1e-4 in float16: its smallest normal number is 6.1e-05), "
         "or keep the optimizer's state and update in float32 (a float32 master copy of the weights)", training=True)
def _adam_epsilon_underflow(ev: Evidence) -> str | None:
    if ev.node.phase != "optimizer" or ev.node.op != ADAM_UPDATE or ev.program is None or ev.recorded is None:
        return None
    eps, moment = adam_argument(ev.node, "eps"), ev.node.outputs[2]  # outputs: parameter, exp_avg, exp_avg_sq, step
    dtype = getattr(torch, ev.program.values[moment].dtype)
    if not eps or not dtype.is_floating_point or torch.tensor(eps, dtype=dtype).item() != 0:
        return None
    zeros = int((ev.recorded(moment) == 0).sum())
    if not zeros or bool(torch.isfinite(ev.output).all()):
        return None
    info = torch.finfo(dtype)
    return (f"the optimizer's epsilon ({eps:g}) is 0 in {ev.program.values[moment].dtype} (its smallest number is "
            f"{info.tiny * info.eps:.3g}), so where the second moment underflowed to 0 ('{moment}' has {zeros} zero "
            "element(s)) the update divides by 0")


@pattern("skipped-step", "a step torch.amp.GradScaler skipped on inf gradients",
         "a step skipped now and then is how GradScaler finds its scale; step after step skipped means the scaled "
         "gradient does not fit the dtype at any scale it tried: make the loss smaller where it is computed (a mean, "
         "not a sum; a smaller loss weight), start the scaler lower (GradScaler(init_scale=...)), or run the op that "
         "overflows outside autocast, in float32", training=True)
def _skipped_step(ev: Evidence) -> str | None:
    if ev.kind != "nonfinite" or ev.program is None or ev.recorded is None or FOUND_INF not in ev.program.values:
        return None
    k, steps = ev.node.step, len(ev.program.step_starts)
    found = [_read(ev, _in_step(FOUND_INF, j)) for j in range(steps)]  # None: not yet computed where the run stands
    if found[k] == 0:
        return None
    before = _read(ev, SCALE if k == 0 else _in_step(f"{SCALE}_updated", k - 1))
    bad = int((~torch.isfinite(ev.output)).sum())
    if found[k] is None:  # a stop in this step's backward: the scaler's check is still ahead
        return (f"this backward op writes {bad} NaN/Inf element(s) in {ev.dtype} in step {k}, at GradScaler's scale "
                f"{before:g}: its check ('{_in_step(FOUND_INF, k)}') finds them, and the scaler skips the step (no "
                "parameter or optimizer state changes) and lowers its scale")
    after = _read(ev, _in_step(f"{SCALE}_updated", k))
    skipped = [j for j, f in enumerate(found) if f]
    listed = "every step" if len(skipped) == steps else \
        f"step{'s' if len(skipped) > 1 else ''} {', '.join(map(str, skipped))} of {steps}"
    return (f"this backward op writes {bad} NaN/Inf element(s) in {ev.dtype} in step {k}, so GradScaler found inf "
            f"gradients ('{_in_step(FOUND_INF, k)}' is 1) and skipped the step: no parameter or optimizer state "
            f"changed, and the scale went from {before:g} to {after:g}. Skipped: {listed}")


def _read(ev: Evidence, name: str) -> float | None:
    """A 0-dim value as the pass wrote it; None where it is not written yet (a stop before it)."""
    try:
        return ev.recorded(name).item()
    except RewindError:
        return None


def _in_step(name: str, k: int) -> str:
    return name if k == 0 else f"{name}_step{k}"
