"""Births: every node that wrote NaN/Inf its inputs did not carry, and what became of those values.

Read from the write log, whose records carry each write's NaN/Inf counts: no tensor is read
except views (they write no memory, so the log holds no counts for them) and the program's
inputs and parameters, each once and only where it decides the answer. A birth is followed
downstream through the values that stay non-finite: it *reaches an output* when a program
output at the end carries them, and it is *absorbed* at the first nodes whose inputs carry
them but whose outputs are finite (a `where` that discards them, a cast to an integer).
An infinity written into a node's arguments as a constant (a mask filled with -inf) is
written on purpose: no birth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from checkpoint.timeline import Timeline
from hardware.program import Node, Program

NO_SOURCE = "the node has no source line (torch.export recorded none for it)"


@dataclass(frozen=True)
class Birth:
    tick: int
    node: Node
    value: str  # the output that holds the new non-finite elements
    kind: str  # "nan" or "inf"
    count: int  # non-finite elements of this kind in `value`, in the pass whose log was read
    reaches_output: bool  # a program output at the end carries non-finite values descended from it
    absorbed_at: list[Node]  # the first nodes downstream whose inputs carry them and whose outputs are finite

    @property
    def absorbed(self) -> bool:
        return not self.reaches_output and bool(self.absorbed_at)

    def to_dict(self) -> dict:
        return {"tick": self.tick, **node_dict(self.node), "value": self.value, "kind": self.kind,
                "count": self.count, "reachesOutput": self.reaches_output,
                "absorbedAt": [node_dict(n) for n in self.absorbed_at]}


def node_dict(node: Node) -> dict:
    """A node as JSON names it: its name, op and source line (with the reason when it has none)."""
    if node.loc is None:
        return {"node": node.name, "op": node.op, "source": None, "sourceReason": NO_SOURCE}
    return {"node": node.name, "op": node.op, "source": str(node.loc)}


def births(timeline: Timeline, program: Program) -> list[Birth]:
    """Every NaN/Inf birth of the pass on `timeline` (recorded to the end first), in tick order."""
    timeline.record_through()
    counts = _Counts(timeline, program)
    found = []
    after = -1
    while (rec := timeline.log.first_nonfinite(after)) is not None:
        after = rec.tick
        found += _born_at(counts, rec.tick)
    return found


def births_at(timeline: Timeline, program: Program, tick: int) -> list[Birth]:
    """The births of the step at `tick` (none when it wrote no NaN/Inf its inputs did not carry)."""
    timeline.record_through()
    return _born_at(_Counts(timeline, program), tick)


def _born_at(counts: "_Counts", tick: int) -> list[Birth]:
    node = counts.timeline.node_at(tick)
    if node is None:
        return []  # a user's edit: the user wrote it
    found = []
    for rec in counts.timeline.log.at_tick(tick):
        if rec.value not in node.outputs:
            continue  # the buffer a node output is copied into: the same write
        for kind, count in (("nan", rec.stats.nan), ("inf", rec.stats.inf)):
            if count and not (kind == "inf" and writes_infinity(node)) and not counts.inputs_carry(node, kind):
                found.append(_followed(counts, tick, node, rec.value, kind, count))
    return found


def writes_infinity(obj: Any) -> bool:
    """Is an infinity written into a node's arguments as a constant (a mask filled with -inf)?"""
    if isinstance(obj, Node):
        return writes_infinity((obj.args, obj.kwargs))
    if isinstance(obj, float):
        return math.isinf(obj)
    if isinstance(obj, (tuple, list)):
        return any(writes_infinity(o) for o in obj)
    if isinstance(obj, dict):
        return any(writes_infinity(o) for o in obj.values())
    return False


def _followed(counts: "_Counts", tick: int, node: Node, value: str, kind: str, count: int) -> Birth:
    """The birth, followed downstream through the values that stay non-finite."""
    program = counts.program
    reached, absorbed = {value}, []
    for later in program.nodes[node.index + 1:]:
        if not any(name in reached for name in later.input_names()):
            continue
        carrying = [name for name in later.outputs if counts.carries(name)]
        if carrying:
            reached.update(carrying)
        else:
            absorbed.append(later)
    return Birth(tick, node, value, kind, count, any(o in reached for o in program.outputs), absorbed)


class _Counts:
    """Each value's NaN and Inf counts as the pass wrote it, from the log where it holds them."""

    def __init__(self, timeline: Timeline, program: Program):
        self.timeline, self.program = timeline, program
        self._known: dict[str, tuple[int, int]] = {}

    def of(self, name: str) -> tuple[int, int]:
        if name not in self._known:
            self._known[name] = self._measure(name)
        return self._known[name]

    def carries(self, name: str, kind: str | None = None) -> bool:
        nan, inf = self.of(name)
        return bool(nan if kind == "nan" else inf if kind == "inf" else nan or inf)

    def inputs_carry(self, node: Node, kind: str) -> bool:
        return any(self.carries(name, kind) for name in node.input_names())

    def _measure(self, name: str) -> tuple[int, int]:
        tl, info = self.timeline, self.program.values[name]
        if not info.dtype.startswith(("float", "bfloat", "complex")):
            return 0, 0
        if info.producer is None:
            return self._inspect(tl.value(name, 0))  # an input or parameter, as the nodes read it
        producer = self.program.nodes[info.producer]
        rec = tl.log.last_writer(value=name)
        if rec is not None and rec.kind != "view":
            return rec.stats.nan, rec.stats.inf
        if rec is None or not any(self.carries(n) for n in producer.input_names()):
            return 0, 0  # a view of finite values is finite
        return self._inspect(tl.value(name, tl.end))

    def _inspect(self, tensor: Any) -> tuple[int, int]:
        stats = self.timeline.driver.inspect(tensor)
        return stats.nan, stats.inf
