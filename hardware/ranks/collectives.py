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
# functional collectives' ops between two ranks (isend_inplace, irecv_inplace, batch_p2p_ops_inplace)
POINT_TO_POINT = ("isend", "irecv", "batch_p2p_ops")
_DIRECTION = {"isend": "send", "irecv": "recv"}


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
    # a send's or recv's transfers (a batch's, one per tensor): ("send" or "recv", peer rank, tag, "float32[8]")
    p2p: tuple[tuple[str, int, int, str], ...] = ()

    @property
    def point_to_point(self) -> bool:
        return self.op in POINT_TO_POINT

    def key(self) -> tuple:
        """What must be equal on every rank for the ranks to run this collective together."""
        tensors = tuple(t.split("[")[0] for t in self.tensors) if self.op in _SHAPE_FREE else self.tensors
        return self.op, self.group, tensors, self.details

    def describe(self) -> str:
        if self.point_to_point:
            both = len({d for d, *_ in self.p2p}) > 1
            shown = ", ".join(f"{d + ' ' if both else ''}{spec} {'to' if d == 'send' else 'from'} rank {peer}"
                              + (f" tag {tag}" if tag else "") for d, peer, tag, spec in self.p2p)
            return f"{self.op} #{self.number} ({shown}) at {self.where}"
        shown = ", ".join(self.tensors + tuple(d.split("=", 1)[1] for d in self.details if d.startswith("reduce_op=")))
        return f"{self.op} #{self.number} ({shown}) at {self.where}"

    def carrier(self, rank: int | None) -> dict:
        """This collective as evidence names what carried a value between ranks (`carriedBy`); a send's or recv's
        with the `rank` it is on, since its number is that rank's own (None: not named)."""
        found = {"collective": self.op, "number": self.number, "node": self.node, "source": self.where}
        return {**found, "rank": rank} if self.point_to_point and rank is not None else found

    def to_dict(self) -> dict:
        return {"number": self.number, "tick": self.tick, "op": self.op, "group": self.group,
                "tensors": list(self.tensors), "details": list(self.details), "where": self.where, "value": self.value,
                "node": self.node, "p2p": [list(t) for t in self.p2p]}

    @staticmethod
    def from_dict(d: dict) -> "Collective":
        return Collective(d["number"], d["tick"], d["op"], d["group"], tuple(d["tensors"]), tuple(d["details"]),
                          d["where"], d["value"], d["node"], tuple(tuple(t) for t in d.get("p2p", ())))


def collectives_of(program: Program, node_tick: list[int]) -> list[Collective]:
    """The collectives of a Program in the order its nodes run; `node_tick`: node index -> tick."""
    found = []
    for node in program.nodes:
        if is_collective(node.op):
            found.append(_collective(program, node, len(found) + 1, node_tick[node.index]))
    return found


def check_point_to_point(collectives: list[Collective], rank: int, world_size: int, world: str | None) -> None:
    """A send or recv whose peer is no rank of the session, or this rank itself, is refused in words before the
    rank runs (it could never complete); so is one on a process group other than the default one (`world`: its
    name; None: not known, a rank opened from its trace), whose peers would be ranks of that group."""
    for c in collectives:
        if c.point_to_point and world is not None and c.group != world:
            raise RewindError(f"{c.describe()} is on a process group other than the default one: sends and recvs "
                              "on a subgroup are not supported yet (docs/ranks.md, \"Process groups\")")
        for direction, peer, _, _ in c.p2p:
            if not 0 <= peer < world_size or peer == rank:
                whom = "itself" if peer == rank else f"rank {peer}, and this session has ranks 0..{world_size - 1}"
                raise RewindError(f"{c.describe()} {direction}s {'to' if direction == 'send' else 'from'} {whom}")


def _collective(program: Program, node: Node, number: int, tick: int) -> Collective:
    names = [a.name for a in node.target._schema.arguments]
    bound = dict(zip(names, node.args))
    bound.update(node.kwargs)
    op = node.op.split(".")[1]
    tensors, details, group = [], [], ""
    for name, value in bound.items():
        if isinstance(value, Ref) or (isinstance(value, (list, tuple)) and value
                                      and all(isinstance(v, Ref) for v in value)):
            tensors.extend(_spec(program, v) for v in (value if isinstance(value, (list, tuple)) else [value]))
        elif name == "group_name":
            group = str(value)
        elif op not in POINT_TO_POINT:  # a send's or recv's peers and tags are its transfers
            details.append(f"{name}={value}")
    where = f"{os.path.basename(node.loc.file)}:{node.loc.line}" if node.loc else node.name
    return Collective(number, tick, op, group, tuple(tensors), tuple(details), where, node.outputs[0], node.name,
                      _transfers(op, bound, tensors, f"{op} at {where}"))


def _spec(program: Program, ref: Ref) -> str:
    info = program.values[ref.name]
    return typed(info.dtype, info.shape)


def typed(dtype: str, shape: Any) -> str:
    """float32[4,8]: a tensor's dtype and shape, as a collective's tensors are written."""
    return f"{dtype}[{','.join(str(s) for s in shape)}]"


def _transfers(op: str, bound: dict, tensors: list[str], what: str) -> tuple[tuple[str, int, int, str], ...]:
    """A send's or recv's transfers: isend(tensor, dst, tag), irecv(tensor, src, tag), batch_p2p_ops(op_list,
    peer_list, tag_list, tensors)."""
    if op == "isend":
        return (("send", int(bound["dst"]), int(bound["tag"]), tensors[0]),)
    if op == "irecv":
        return (("recv", int(bound["src"]), int(bound["tag"]), tensors[0]),)
    if op == "batch_p2p_ops":  # torch.export checks neither the lists' lengths nor the ops' names
        kinds, peers, tags = bound["op_list"], bound["peer_list"], bound["tag_list"]
        if not len(kinds) == len(peers) == len(tags) == len(tensors):
            raise RewindError(f"{what} has {len(kinds)} op(s), {len(peers)} peer(s), {len(tags)} tag(s) and "
                              f"{len(tensors)} tensor(s): a batch gives one of each per transfer")
        unknown = [o for o in kinds if o not in _DIRECTION]
        if unknown:
            raise RewindError(f"{what} names op {unknown[0]!r}: a batch's ops are 'isend' and 'irecv'")
        return tuple((_DIRECTION[o], int(p), int(t), spec) for o, p, t, spec in zip(kinds, peers, tags, tensors))
    return ()


@dataclass
class Pairing:
    """Which collectives of the ranks run together (docs/ranks.md, "Point-to-point send and recv"), by (rank, index
    of the collective among the rank's, from 0). A collective runs with the collective counted the same on every
    other rank of its process group (the k-th of the group with the k-th; sends and recvs not counted); a send with the recv that
    takes it, the j-th send from rank a to rank b with tag t with the j-th recv at b from a with tag t (a batch:
    each of its transfers). `partners`: each collective's, as (peer, its index there, or None: the peer has none
    to match it), `conflicts`: the partners whose transfer disagrees (another dtype or element count), with why."""

    partners: dict[tuple[int, int], list[tuple[int, int | None]]]
    conflicts: dict[tuple[int, int], list[tuple[int, int, str]]]

    @staticmethod
    def of(collectives: dict[int, list[Collective]], groups: dict[str, tuple[int, ...]]) -> "Pairing":
        """`groups`: each process group's ranks, by name (a group not named: every rank)."""
        ranks = sorted(collectives)
        partners: dict[tuple[int, int], list[tuple[int, int | None]]] = {}
        conflicts: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
        grouped: dict[int, dict[str, list[int]]] = {r: {} for r in ranks}  # rank -> group -> its collectives there
        for r in ranks:
            for i, c in enumerate(collectives[r]):
                if not c.point_to_point:
                    grouped[r].setdefault(c.group, []).append(i)
        for r in ranks:
            for group, indices in grouped[r].items():
                others = [q for q in groups.get(group, ranks) if q != r and q in grouped]
                for k, i in enumerate(indices):
                    partners[(r, i)] = [(q, _kth(grouped[q].get(group, []), k)) for q in others]
        lanes: dict[tuple[int, int, int], tuple[list, list]] = {}  # (from, to, tag) -> its sends, its recvs
        for r in ranks:
            for i, c in enumerate(collectives[r]):
                if c.point_to_point:
                    partners[(r, i)] = []
                for direction, peer, tag, spec in c.p2p:
                    sends, recvs = lanes.setdefault((r, peer, tag) if direction == "send" else (peer, r, tag), ([], []))
                    (sends if direction == "send" else recvs).append((i, spec))
        for (a, b, _), (sends, recvs) in lanes.items():
            for j in range(max(len(sends), len(recvs))):  # the j-th send of the lane with its j-th recv
                sent, received = _kth(sends, j), _kth(recvs, j)
                if sent is not None:
                    partners[(a, sent[0])].append((b, None if received is None else received[0]))
                if received is not None:
                    partners[(b, received[0])].append((a, None if sent is None else sent[0]))
                if sent is not None and received is not None and not _same_bytes(sent[1], received[1]):
                    why = f"rank {a} sends {sent[1]} and rank {b} receives {received[1]}"
                    conflicts.setdefault((a, sent[0]), []).append((b, received[0], why))
                    conflicts.setdefault((b, received[0]), []).append((a, sent[0], why))
        return Pairing(partners, conflicts)

    def ready(self, waiting: dict[int, int]) -> dict[int, int]:
        """Of the ranks `waiting` (rank -> the index of the collective it waits at), those that may run theirs now:
        every partner of each waits at the collective that matches it (checked again as ranks drop out: a batch's
        sends and recvs with several peers run only all together)."""
        ready = dict(waiting)
        while True:
            dropped = [r for r, i in ready.items()  # a partner with none to match it (None) never waits at it
                       if any(m is None or ready.get(q) != m for q, m in self.partners[(r, i)])]
            if not dropped:
                return ready
            for r in dropped:
                del ready[r]

    def group(self, rank: int, index: int) -> dict[int, int]:
        """The collective's own rank and its partners that have one matching it: rank -> index."""
        return {rank: index, **{q: m for q, m in self.partners[(rank, index)] if m is not None}}

    def peers(self, c: Collective, rank: int, index: int, direction: str) -> dict[int, int]:
        """Rank `rank`'s collective `c` (its `index`-th)'s partners that data flows between in `direction`: every
        partner of a collective of a process group; of a send or recv, the peers of its transfers of that direction
        ("recv": the ranks it brings data in from; "send": those it carries data to — a batch may do both)."""
        return {q: m for q, m in self.group(rank, index).items() if q != rank and (
            not c.point_to_point or any(d == direction and p == q for d, p, _, _ in c.p2p))}


def _kth(items: list, k: int) -> Any:
    return items[k] if k < len(items) else None


def _same_bytes(sent: str, received: str) -> bool:
    """A send and its recv agree on dtype and element count (the recv's template may have another shape)."""
    def count(spec: str) -> tuple[str, int]:
        dtype, _, dims = spec.partition("[")
        n = 1
        for d in dims.rstrip("]").split(","):
            n *= int(d) if d.strip().lstrip("-").isdigit() else 1
        return dtype, n
    return count(sent) == count(received)


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
