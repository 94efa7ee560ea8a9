"""A rank's collectives: what each one is (so the ranks' next ones can be matched before any of them runs), and
the ledger that lets a collective node run only together with its peers.

A collective is a node of the Program (torch.export writes torch.distributed's functional collectives as
`_c10d_functional.*` nodes, each followed by a `wait_tensor` node). Ranks match when their next collectives
agree on op, process group, tensor dtypes and shapes and the op's other arguments (reduce op, group size,
source rank); all_to_all_single's shapes may differ by rank (its split sizes say how), so only its dtypes count.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hardware.errors import RewindError
from hardware.program import Node, Program, Ref
from hardware.torch_tensors import is_collective

_SHAPE_FREE = ("all_to_all_single",)  # ops whose tensors' shapes may differ between ranks
_POINT_TO_POINT = ("isend", "irecv")  # functional collectives' ops between two ranks (isend_inplace, irecv_inplace)


@dataclass(frozen=True)
class Collective:
    """The `number`-th collective (from 1) a rank runs, at position `tick` of its Timeline."""

    number: int
    tick: int
    op: str  # all_reduce, all_gather_into_tensor, ...
    group: str  # the process group's name
    tensors: tuple[str, ...]  # "float32[8]" per tensor argument
    details: tuple[str, ...]  # the other arguments: "reduceOp=sum", "group_size=2"
    where: str  # model.py:88
    value: str = ""  # the value it writes (its result, once waited for)
    node: str = ""  # its node's name

    def key(self) -> tuple:
        """What must be equal on every rank for the ranks to run this collective together."""
        tensors = tuple(t.split("[")[0] for t in self.tensors) if self.op in _SHAPE_FREE else self.tensors
        return self.op, self.group, tensors, self.details

    def describe(self) -> str:
        shown = ", ".join(self.tensors + tuple(d.split("=", 1)[1] for d in self.details if d.startswith("reduce_op=")))
        return f"{self.op} #{self.number} ({shown}) at {self.where}"

    def to_dict(self) -> dict:
        return {"number": self.number, "tick": self.tick, "op": self.op, "group": self.group,
                "tensors": list(self.tensors), "details": list(self.details), "where": self.where, "value": self.value,
                "node": self.node}

    @staticmethod
    def from_dict(d: dict) -> "Collective":
        return Collective(d["number"], d["tick"], d["op"], d["group"], tuple(d["tensors"]), tuple(d["details"]),
                          d["where"], d["value"], d["node"])


def collectives_of(program: Program, node_tick: list[int]) -> list[Collective]:
    """The collectives of a Program in the order its nodes run; `node_tick`: node index -> tick."""
    found = []
    for node in program.nodes:
        if is_collective(node.op):
            found.append(_collective(program, node, len(found) + 1, node_tick[node.index]))
    return found


def refuse_point_to_point(collectives: list[Collective]) -> None:
    """A point-to-point send or recv is refused in words before the rank runs: a consistent cut here counts
    collectives that every rank crosses together, and a send involves two ranks (docs/ranks.md, "Point-to-point
    send and recv"); matched as collectives, a send and its recv would be reported as a mismatch, no real hang."""
    found = [c for c in collectives if c.op in _POINT_TO_POINT]
    if found:
        named = ", ".join(f"{c.op} at {c.where} (node {c.node})" for c in found)
        raise RewindError(f"point-to-point send/recv is not supported with ranks yet: {named} (docs/ranks.md, "
                          "\"Point-to-point send and recv\")")


def _collective(program: Program, node: Node, number: int, tick: int) -> Collective:
    names = [a.name for a in node.target._schema.arguments]
    bound = dict(zip(names, node.args))
    bound.update(node.kwargs)
    tensors, details, group = [], [], ""
    for name, value in bound.items():
        if isinstance(value, Ref):
            info = program.values[value.name]
            tensors.append(f"{info.dtype}[{','.join(str(s) for s in info.shape)}]")
        elif name == "group_name":
            group = str(value)
        else:
            details.append(f"{name}={value}")
    where = f"{os.path.basename(node.loc.file)}:{node.loc.line}" if node.loc else node.name
    return Collective(number, tick, node.op.split(".")[1], group, tuple(tensors), tuple(details), where,
                      node.outputs[0], node.name)


def mismatch(next_of: dict[int, Collective | None], passed: dict[int, int]) -> tuple[str, int] | None:
    """Why the ranks' next collectives cannot run together, each side named by rank, and the rank on the side with
    fewest ranks (None when they can). `next_of`: rank -> its next collective (None: it has reached the end of its
    program); `passed`: rank -> collectives it has run."""
    sides: dict[Any, list[int]] = {}
    for rank in sorted(next_of):
        c = next_of[rank]
        sides.setdefault(c.key() if c is not None else None, []).append(rank)
    if len(sides) == 1:  # one collective on every rank (or every rank at its end: nothing to match)
        return None
    parts = []
    ordered = sorted(sides.items(), key=lambda kv: (len(kv[1]), kv[1]))
    for _, ranks in ordered:
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
        verb = "calls" if len(ranks) == 1 else "call"
        c = next_of[ranks[0]]
        if c is None:
            reach = "reaches" if len(ranks) == 1 else "reach"
            parts.append(f"{who} {reach} the end of the program after {passed[ranks[0]]} collective(s)")
        else:
            parts.append(f"{who} {verb} {c.describe()}")
    return "; ".join(parts), ordered[0][1][0]


class Ledger:
    """How this rank's collective nodes run (hardware/torch_tensors.COLLECTIVES): the one the coordinator let through
    runs for real, with every peer, and is waited for before anything reads its result; a collective run again
    (a value recomputed after the ring evicted it, a replay check) gives the result recorded when it ran, never
    calling its peers alone; any other is refused, so no motion of one rank can block in a collective."""

    def __init__(self, rank: int, lockstep: bool = False):
        """`lockstep`: every collective runs for real when reached, once (a pass that every rank runs at the same
        time, reaching the same collectives in the same order: a reference pass, hardware/ranks/forensics.py)."""
        self.rank = rank
        self.lockstep = lockstep
        self.allowed: int | None = None  # the node index the coordinator let through
        self.recorded: dict[int, list[Any]] = {}  # node index -> its outputs when it ran
        self.refused: Node | None = None  # the last collective refused (a request that ran this rank too far)
        self.calls = 0  # collectives run for real
        self.replayed = 0  # collectives answered with their recorded result

    def run(self, node: Node, call: Callable[[], list[Any]]) -> list[Any]:
        recorded = self.recorded.get(node.index)
        if recorded is not None:  # a node runs once a pass: this is a recomputation, never a new collective
            self.replayed += 1
            return list(recorded)
        if self.allowed != node.index and not self.lockstep:
            self.refused = node
            raise RewindError(f"rank {self.rank} may not run {node.describe()} on its own: a collective runs only "
                              "when every rank has reached it")
        outputs = [torch.ops._c10d_functional.wait_tensor(t) for t in call()]
        self.calls += 1
        self.recorded[node.index] = outputs  # the tensors the ring retains too: no copy while it keeps them
        return outputs
