"""A training Program as the analyses read it: its steps, the same node in each step, where its update is made, and
how far each step's update moved the parameters.

A training Program (hardware/frontends/torch_train.py) repeats step 0's nodes once per step, at the same offset from
each step's first node; an inference pass is one step, step 0. Forensics, repair and experiments use these so a
training Program stays a Program to them: a fix of a node is a fix of that node in every step, an experiment's patch
from step k patches the node in steps k and later.
"""

from __future__ import annotations

import ast
import math
from typing import Callable

import torch

from hardware.errors import RewindError
from hardware.program import Node, Program, SourceLoc

# A step's update "explodes" when it moves the parameters by more than their own size: healthy training moves
# them by a small fraction of it (a learning rate's worth).
EXPLODING_UPDATE = 1.0

ValueOf = Callable[[str], torch.Tensor]


def count(program: Program) -> int:
    """How many steps the Program runs (an inference pass: one)."""
    return max(1, len(program.step_starts))


def is_training(program: Program | None) -> bool:
    return program is not None and bool(program.step_starts)


def counterparts(program: Program, index: int, first: int = 0) -> list[int]:
    """The node at `index` as each step from `first` on runs it (itself alone in an inference pass)."""
    if not is_training(program):
        return [index] if first == 0 else []
    node = program.nodes[index]
    offset = index - program.step_starts[node.step]
    return [start + offset for start in program.step_starts[first:]]


def nodes_from_step(program: Program, indices: list[int], first: int) -> list[int]:
    """Every node of steps `first` and later that is one of `indices` in its own step: a patch from a step on."""
    check_step(program, first)
    return sorted({i for index in indices for i in counterparts(program, index, first)})


def check_step(program: Program, step: object) -> int:
    """A step of the Program, or a refusal in words."""
    last = count(program) - 1
    if type(step) is not int or not 0 <= step <= last:
        what = ("an inference pass has one step, step 0 (launch its training step, entry train_step, with steps, "
                "to patch from a later one)") if not is_training(program) else f"it runs steps 0 to {last}"
        raise RewindError(f"step {step!r} is not a step of {program.name}: {what}")
    return step


def optimizer_line(program: Program) -> SourceLoc | None:
    """Where the user's file makes the optimizer (`torch.optim.Adam(...)`): the optimizer nodes' line. Found in the
    source of the user's files by the optimizer's class name; None when no line calls it."""
    name = program.optimizer
    if not is_training(program) or not name:
        return None
    for file, text in sorted(program.source_files.items()):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _called(n.func) == name]
        if calls:
            return SourceLoc(file, min(c.lineno for c in calls))
    return None


def _called(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def place(program: Program | None, node: Node) -> SourceLoc | None:
    """A node's source line; an optimizer node's is the line that makes the optimizer."""
    return optimizer_line(program) if is_training(program) and node.loc is None and node.phase == "optimizer" \
        else node.loc


def in_words(program: Program | None, node: Node, verb: str = "in") -> str:
    """Where a node is, for a person: `at model.py:12 in `div`` (`by`: `at model.py:12 by `div``); in a training
    step `in the backward of `log` at model.py:12 (step 0)`, `in the Adam update (made at model.py:30, step 2)`,
    `at model.py:12 in `mul` (step 1)` (`by` names the op after any of them)."""
    loc = place(program, node)
    at = f"{loc.file.rsplit('/', 1)[-1]}:{loc.line}" if loc else f"node '{node.name}'"
    op = f"{verb} `{op_name(node)}`"
    if not is_training(program):
        return f"at {at} {op}"
    forward = program.forward_node(node)
    by = f" {op}" if verb == "by" else ""
    if forward is not None:
        return f"in the backward of `{op_name(forward)}` at {at} (step {node.step}){by}"
    if node.phase == "optimizer":
        made = f"made at {at}" if loc else f"'{node.name}'"
        return f"in the {program.optimizer or 'optimizer'} update ({made}, step {node.step}){by or f' in `{op_name(node)}`'}"
    return f"at {at} {op} (step {node.step})"


def op_name(node: Node) -> str:
    """`cos` for aten.cos.default."""
    return node.op_short.removeprefix("aten.")


def training_fields(program: Program, node: Node) -> dict:
    """A node's part of a training step as JSON: its phase and step, and for a backward node the forward node it
    differentiates (each null with its reason)."""
    forward = program.forward_node(node)
    out: dict = {"phase": node.phase, "step": node.step}
    if forward is None:
        why = {"forward": "a forward node differentiates none", "optimizer": "an optimizer node differentiates none",
               "backward": "autograd ran this backward op outside any forward op's backward"}[node.phase]
        return {**out, "forwardNode": None, "forwardNodeReason": why, "forwardSource": None,
                "forwardSourceReason": why}
    out.update(forwardNode=forward.name, forwardOp=forward.op)
    if forward.loc is None:
        return {**out, "forwardSource": None, "forwardSourceReason": "the forward node has no source line"}
    return {**out, "forwardSource": str(forward.loc)}


# -- the parameters, step by step -------------------------------------------------------------------------------

def updates(program: Program) -> list[dict[str, str]]:
    """Per step, each trained parameter -> the value its update writes in that step."""
    out: list[dict[str, str]] = [{} for _ in range(count(program))]
    params = {n for n, v in program.values.items() if v.kind == "parameter"}
    for updated, target in program.buffer_mutations.items():
        producer = program.values[updated].producer
        if target in params and producer is not None:
            out[program.nodes[producer].step][target] = updated
    return out


def update_ratios(program: Program, value_of: ValueOf, steps: int | None = None) -> list[float]:
    """Per step (the first `steps`): how far its update moved the parameters, over their size before it (all
    parameters together, so a bias that starts at zero does not count as infinitely moved); NaN where they are not
    finite. `value_of` gives each value as the pass wrote it (a parameter: as the pass started)."""
    ratios = []
    ups = updates(program)
    before = {p: value_of(p) for p in (ups[0] if is_training(program) else {})}
    for step in ups[:steps]:
        after = {p: value_of(u) for p, u in step.items()}
        size, moved = _norm(before[p] for p in after), _norm(after[p] - before[p] for p in after)
        ratios.append(moved / size if size > 0 else math.nan)
        before.update(after)
    return ratios


def exploded_at(program: Program, value_of: ValueOf) -> int | None:
    """The first step whose update moved the parameters by more than EXPLODING_UPDATE times their size."""
    if not is_training(program):
        return None
    return next((k for k, r in enumerate(update_ratios(program, value_of)) if r > EXPLODING_UPDATE), None)


def outputs_after(program: Program, step: int | None) -> list[bool]:
    """Which of the Program's outputs come after step `step`'s update (its losses from step `step` + 1 on, and the
    trained values at the end): all False for None."""
    later = set(program.losses[step + 1:]) if step is not None else set()
    return [step is not None and (name in later or name not in program.losses) for name in program.outputs]


def gradient_norms(program: Program, value_of: ValueOf, steps: int | None = None) -> list[float]:
    """Per step (the first `steps`): the norm of all the parameters' gradients together, as clip_grad_norm_
    measures it."""
    return [_norm(value_of(g) for g in step.values()) for step in program.gradients[:steps]]


def _norm(tensors) -> float:
    return float(math.sqrt(sum(float(t.double().square().sum()) for t in tensors)))
