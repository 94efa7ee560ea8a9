"""Why a training step could not be traced, in the user's terms: the line of their code, what went wrong there and
what to change (torch_export.export_failure says the same for an export). No traceback and no Python exception's
class reaches the user; torch's own words are the last resort, cut to what they say about the user's step.

The trace (hardware/frontends/torch_train.py) runs the exported forward node by node, then autograd, then the
optimizer's update; `StepWhere` follows it, so a failure knows the forward node that was running, or whose gradient
was being computed."""

from __future__ import annotations

import linecache
import os
import re
import traceback
from dataclasses import dataclass, field

import torch

from hardware.frontends.torch_export import _is_user_file, _user_frames, _without_comment

_TORCH_TAIL = re.compile(r"\n\s*\n\s*While executing .*", re.S)  # what the fx Interpreter appends: its own graph
_DATA_DEPENDENT = ("_local_scalar_dense", "data-dependent", "Could not guard on data-dependent",
                   "Could not extract specialized integer from data-dependent")


@dataclass
class StepWhere:
    """Where in the user's step the trace is: the forward node running, the forward node whose gradient autograd
    computes, and which forward node made each autograd node (by its sequence number)."""

    running: torch.fx.Node | None = None
    differentiating: int | None = None
    made_by: dict[int, torch.fx.Node] = field(default_factory=dict)
    phase: str = "forward"

    def ran(self, node: torch.fx.Node, result: object) -> None:
        """`node` ran and returned `result`: its autograd nodes are its own."""
        for tensor in result if isinstance(result, (tuple, list)) else (result,):
            fn = getattr(tensor, "grad_fn", None)
            if fn is not None:
                self.made_by.setdefault(fn._sequence_nr(), node)

    def node(self) -> torch.fx.Node | None:
        if self.phase == "backward":
            return self.made_by.get(self.differentiating) if self.differentiating is not None else None
        return self.running if self.phase == "forward" else None


def step_failure(exc: BaseException, where: StepWhere) -> str:
    """What to tell the user about `exc`, raised while tracing the step at `where`."""
    text = _torch_words(exc)
    at = _at(exc, where)
    if any(marker in text for marker in _DATA_DEPENDENT):
        return (f"{at}reads a tensor's value (.item(), a Python condition on a tensor, or an op that checks its "
                "input's values), which a traced training step cannot do: compute both branches and pick with "
                "torch.where, give the op the number it would read (one_hot(target, num_classes)), or decide on a "
                "shape or a Python value instead")
    if "does not require grad and does not have a grad_fn" in text:
        return ("the loss does not depend on any parameter the optimizer updates: it is computed from values cut off "
                "from the gradient (.detach(), torch.no_grad(), .item(), a tensor made from plain numbers)")
    missing = re.search(r"derivative for (\S+) is not implemented", text)
    if missing:
        return (f"{at}calls {missing[1].strip('.')}, which torch has no gradient for: compute it with ops torch can "
                "differentiate, or outside the loss (under torch.no_grad())")
    return f"{at}failed: {text}"


def _torch_words(exc: BaseException) -> str:
    """torch's message without what the fx Interpreter appended (its own graph and a stack that is not the user's)."""
    text = _TORCH_TAIL.sub("", str(exc)).strip()
    return text or "no reason given"


def _at(exc: BaseException, where: StepWhere) -> str:
    """`model.py:15 ``soft = one_hot(...)`` `: the user's line that raised (a hook of theirs), else the one the node
    being run or differentiated came from, else the part of the step."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_user_file(f.filename)]
    if frames:
        return _quoted(frames[-1].filename, frames[-1].lineno or 0)
    line = _node_line(where.node())
    if line:
        return {"forward": "", "backward": "the gradient of "}.get(where.phase, "") + line
    return {"forward": "the forward or the loss ", "backward": "the backward "}.get(where.phase,
                                                                                  "the optimizer's update ")


def _node_line(node: torch.fx.Node | None) -> str:
    """The user's line a node of the exported step came from; "" when it is not known."""
    found = _user_frames(node.meta.get("stack_trace") or "", {}) if node is not None else []
    return _quoted(found[-1].loc.file, found[-1].loc.line) if found else ""


def _quoted(file: str, line: int) -> str:
    code = _without_comment(linecache.getline(file, line))
    return f"{os.path.basename(file)}:{line} `{code}` " if code else f"{os.path.basename(file)}:{line} "


def data_shaped(graph: torch.fx.Graph) -> str | None:
    """What to tell the user when a node of the exported step makes a tensor whose shape depends on values (boolean
    mask indexing, nonzero, bincount): a Program's shapes are fixed. None when every shape is."""
    for node in graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and not all(isinstance(d, int) for d in value.shape):
            line = _node_line(node)
            return (f"{line or 'the forward or the loss '}makes a tensor whose shape depends on the values (a boolean "
                    "mask's selection, nonzero, unique, bincount), and a training step's shapes are fixed when it is "
                    "traced: keep the shape (torch.where(mask, x, 0) in place of x[mask], one_hot(y, n).sum(0) in "
                    "place of bincount(y))")
    return None
