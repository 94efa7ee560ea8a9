"""Edits of a training Program: nodes inserted around its backward and before its update, the fixes of a training
step that no patch of one node can say (a patch changes how one node computes; clipping reads every gradient).

- loss scaling: the loss's gradient (the backward's seed, 1) times `scale` before the backward, each parameter's
  gradient times 1 / `scale` before the optimizer: what torch.amp.GradScaler does with a fixed scale;
- gradient clipping: the gradients' total norm measured and each gradient scaled by min(1, maxNorm / (norm + 1e-6))
  before the optimizer, node for node as torch.nn.utils.clip_grad_norm_ computes it.

An edit is applied to every step, and to each input set's Program in turn (validation runs the edited Program as it
runs an edited copy of the model). The Program's values keep their names; the inserted ones are new, and the nodes
that read a gradient or the seed read the edited value instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from hardware.errors import RewindError
from hardware.program import Node, Program, Ref, ValueInfo, renamed_refs
from provenance.steps import is_training

CLIP_EPSILON = 1e-6  # torch.nn.utils.clip_grad_norm_'s


@dataclass(frozen=True)
class _New:
    """A node to insert before the Program's node `before`."""

    before: int
    name: str
    op: Any  # a torch operator overload
    args: tuple
    output: str
    like: ValueInfo  # the dtype of its output
    shape: tuple[int, ...]
    phase: str
    step: int


@dataclass(frozen=True)
class ProgramEdit:
    """A named edit with its settings (JSON numbers), as the knowledge base records it."""

    kind: str  # a key of EDITS
    settings: tuple[tuple[str, float], ...]

    @staticmethod
    def of(kind: str, settings: dict) -> "ProgramEdit":
        if kind not in EDITS:
            raise RewindError(f"no program edit '{kind}' (edits: {', '.join(EDITS)})")
        want = EDITS[kind].settings
        if set(settings) != set(want) or not all(_positive(v) for v in settings.values()):
            raise RewindError(f"the edit '{kind}' takes {', '.join(want)}: positive numbers")
        return ProgramEdit(kind, tuple((k, float(settings[k])) for k in want))

    def apply(self, program: Program) -> Program:
        if not is_training(program):
            raise RewindError(f"{self.describe()} edits a training step; {program.name} is an inference pass")
        return EDITS[self.kind].make(program, **dict(self.settings))

    def describe(self) -> str:
        return EDITS[self.kind].describe(**dict(self.settings))

    def to_dict(self) -> dict:
        return {"kind": "program", "edit": self.kind, "settings": dict(self.settings), "description": self.describe(),
                "inSource": EDITS[self.kind].in_source}


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def loss_scaled(program: Program, scale: float) -> Program:
    """Each step's backward seed times `scale`, each of its gradients times 1 / `scale` before the update."""
    edit = _Insertions(program)
    mul = torch.ops.aten.mul.Tensor
    for step in range(len(program.step_starts)):
        seed = _seed(program, step)
        out = seed.outputs[0]
        edit.replace(out, edit.add(seed.index + 1, step, "backward", f"{_in_step0(out, step)}_scaled", out, mul,
                                   (Ref(out), scale)))
        update = _first_update(program, step)
        for grad in program.gradients[step].values():
            edit.replace(grad, edit.add(update, step, "optimizer", f"{_in_step0(grad, step)}_unscaled", grad, mul,
                                        (Ref(grad), 1 / scale)))
    return edit.program()


def gradients_clipped(program: Program, max_norm: float) -> Program:
    """Before each step's update, its gradients scaled so that their total norm is at most `max_norm`."""
    edit = _Insertions(program)
    aten = torch.ops.aten
    for step in range(len(program.step_starts)):
        grads = list(program.gradients[step].values())
        first = grads[0]

        def add(name: str, like: str, op: Any, args: tuple, shape: tuple[int, ...] = ()) -> str:
            return edit.add(_first_update(program, step), step, "optimizer", name, like, op, args, shape)
        norms = [add(f"{_in_step0(g, step)}_norm", g, aten.linalg_vector_norm.default, (Ref(g), 2.0)) for g in grads]
        stacked = add("grad_norms", first, aten.stack.default, ([Ref(n) for n in norms],), (len(norms),))
        total = add("grad_total_norm", first, aten.linalg_vector_norm.default, (Ref(stacked), 2.0))
        shifted = add("grad_total_norm_eps", first, aten.add.Tensor, (Ref(total), CLIP_EPSILON))
        inverse = add("grad_clip_inverse", first, aten.reciprocal.default, (Ref(shifted),))
        coefficient = add("grad_clip_coef", first, aten.mul.Tensor, (Ref(inverse), max_norm))
        clamped = add("grad_clip_coef_clamped", first, aten.clamp.default, (Ref(coefficient), None, 1.0))
        for g in grads:
            edit.replace(g, add(f"{_in_step0(g, step)}_clipped", g, aten.mul.Tensor, (Ref(g), Ref(clamped)),
                                program.values[g].shape))
    return edit.program()


class _Insertions:
    """The nodes an edit inserts, named as a step's values are (`grad_p_w_norm`, `grad_p_w_norm_step2`), and the
    values they stand for from where they are made on."""

    def __init__(self, program: Program):
        self.original = program
        self.new: list[_New] = []
        self.reads: dict[str, str] = {}
        self.taken = set(program.values) | {n.name for n in program.nodes}

    def add(self, before: int, step: int, phase: str, name: str, like: str, op: Any, args: tuple,
            shape: tuple[int, ...] | None = None) -> str:
        """Insert a node before node `before`, its value named `name` as in step 0 (`_step<k>` appended in step k,
        as every value of a later step is), of `like`'s dtype (and shape)."""
        wanted = f"{name}_step{step}" if step else name
        unique = next(n for i in range(len(self.taken) + 1) if (n := f"{wanted}_{i}" if i else wanted)
                      not in self.taken)
        self.taken.add(unique)
        info = self.original.values[like]
        self.new.append(_New(before, unique, op, args, unique, info, info.shape if shape is None else shape, phase,
                             step))
        return unique

    def replace(self, value: str, by: str) -> None:
        self.reads[value] = by

    def program(self) -> Program:
        return inserted(self.original, self.new, self.reads)


def _in_step0(name: str, step: int) -> str:
    """A value of step `step` named as its step 0 counterpart is."""
    return name.removesuffix(f"_step{step}") if step else name


def _seed(program: Program, step: int) -> Node:
    """The step's backward seed: the 1 the loss's gradient starts from (autograd's ones_like of the loss)."""
    loss = program.losses[step]
    found = next((n for n in program.nodes if n.step == step and n.phase == "backward"
                  and n.op_short == "aten.ones_like" and n.input_names() == [loss]), None)
    if found is None:
        raise RewindError(f"step {step} of {program.name} has no backward seed (a ones_like of its loss '{loss}') "
                          "to scale")
    return found


def _first_update(program: Program, step: int) -> int:
    """The step's first optimizer node: where nodes that read every gradient go."""
    found = next((n.index for n in program.nodes if n.step == step and n.phase == "optimizer"), None)
    if found is None:
        raise RewindError(f"step {step} of {program.name} has no optimizer node")
    return found


def inserted(program: Program, new: list[_New], reads: dict[str, str]) -> Program:
    """The Program with `new` nodes inserted, each before the node it names, and every original node after a
    renamed value's replacement reading the replacement (`reads`: value -> the value that stands for it)."""
    before: dict[int, list[_New]] = {}
    for n in new:
        before.setdefault(n.before, []).append(n)
    nodes: list[Node] = []
    index_of: dict[int, int] = {}
    values = {name: replace(info, last_use=-1) for name, info in program.values.items()}
    replaced_at = {n.output: None for n in new}  # a replacement is read from where it is made on
    for node in program.nodes:
        for n in before.get(node.index, []):
            replaced_at[n.output] = len(nodes)
            nodes.append(Node(len(nodes), n.name, str(n.op), n.op, n.args, {}, [n.output], phase=n.phase, step=n.step))
            values[n.output] = ValueInfo(n.output, "intermediate", n.like.dtype, n.shape, producer=len(nodes) - 1)
        index_of[node.index] = len(nodes)
        rename = {old: mine for old, mine in reads.items() if replaced_at[mine] is not None}
        nodes.append(replace(node, index=len(nodes), args=renamed_refs(node.args, rename),
                             kwargs=renamed_refs(node.kwargs, rename)))
    nodes = [replace(n, differentiates=index_of[n.differentiates]) if n.differentiates is not None else n
             for n in nodes]
    for info in values.values():
        if info.producer is not None and info.name not in replaced_at:
            info.producer = index_of[info.producer]
    starts = [next(n.index for n in nodes if n.step == k) for k in range(len(program.step_starts))]
    return replace(program, nodes=nodes, values=values, step_starts=starts)


@dataclass(frozen=True)
class _Kind:
    make: Callable[..., Program]
    settings: tuple[str, ...]
    describe: Callable[..., str]
    in_source: str  # how the user's own training loop says it


EDITS: dict[str, _Kind] = {
    "loss-scaling": _Kind(
        loss_scaled, ("scale",),
        lambda scale: f"the loss scaled by {scale:g} before the backward, the gradients by 1/{scale:g} before the "
                      "optimizer",
        "scale the loss before backward() and unscale the gradients before optimizer.step(): "
        "torch.amp.GradScaler (scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update())"),
    "gradient-clipping": _Kind(
        lambda program, maxNorm: gradients_clipped(program, maxNorm), ("maxNorm",),
        lambda maxNorm: f"the gradients' total norm clipped to {maxNorm:g} before the optimizer",
        "clip before optimizer.step(): torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)"),
}
