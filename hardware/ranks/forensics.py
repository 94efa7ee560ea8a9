"""Forensics per rank (docs/ranks.md, "Forensics per rank"): each rank's pass against a float64 reference of the same
ranks, the rank and line where an error was introduced, and the collective that carried it to the other ranks.

A rank's reference is the single-process reference pass (provenance/reference.py: the same Program on
`torch:cpu:float64`) run in the rank's own process, with one difference: at each collective it needs its peers'
reference values. So every rank runs its reference pass at the same time (the coordinator asks them all at once),
and each collective of the pass runs for real, in float64, through the ranks' gloo process group (a lockstep Ledger,
hardware/ranks/collectives.py): the ranks reach their collectives in the same order, since each rank has run every
one of its collectives with its peers already (the coordinator let them through only when they matched). A
collective recomputed later (a value the reference's ring evicted) gives what it gave; the rank's own pass keeps its
own Ledger, so nothing else runs a collective. Ranks opened from their traces run it too: a trace holds the Program
with its inputs and parameters, the ranks form a process group on loopback for it, and the CPU reruns their nodes.

Each rank then looks for its first divergence as a single session does (provenance/forensics.py), with one rule
for a collective: what it introduces cannot be measured on one rank (its result is made of every rank's input), so a
collective whose input on this rank is beyond tolerance inherited its error, as any node does, and one whose input is
within is where the error came in from the peers: the finding is carried, and `carriedBy` names the collective and
the ranks whose inputs to it were beyond tolerance (none: the collective's own arithmetic made it). The finding
that is not carried, earliest by the collectives before it (then by rank), is the root: the rank and line that
introduced the error.

The reference passes are kept for the run, each on its rank's Session, so a request about one rank's reference
(compareWithReference, referenceValue, readReference through DAP: dap_server/ranks.py) is answered by that rank's
engine with the usual handler, once `reference_passes` has run them all.

RankForensics is the part a rank's engine answers (hardware/ranks/worker.py); `forensics` below it, the
coordinator's part.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

import torch.distributed as dist

from hardware.errors import RewindError, echo
from hardware.ranks.collectives import Ledger
from provenance.forensics import Forensics

if TYPE_CHECKING:
    from hardware.ranks.collectives import Collective

CARRIED = ("a collective's result is made of every rank's input: rerun on this rank's reference inputs alone it "
           "measures nothing of its own (carriedBy names the ranks whose inputs brought the error)")


class Ranks(Protocol):
    """What the coordinator's part uses of the Coordinator (which imports this module)."""

    world_size: int
    groups: dict[str, tuple[int, ...]]  # each process group's ranks, by name

    def ask_all(self, message: dict, doing: str) -> dict[int, Any]: ...
    def collectives(self, rank: int) -> list["Collective"]: ...
    def partners(self, rank: int, number: int) -> dict[int, int]: ...
    def senders(self, rank: int, number: int) -> dict[int, int]: ...


# -- what a rank answers -------------------------------------------------------------------------------------
class RankForensics:
    """The forensics requests a rank's engine answers (mixed into RankEngine). Its reference pass is kept on its
    Session (FencedSession.reference_forensics, hardware/ranks/worker.py), so the usual requests about the reference
    (compareWithReference, referenceValue, readReference) read that pass."""

    rank: int
    session: Any  # a FencedSession (hardware/ranks/worker.py, which imports this module)
    collectives: list["Collective"]
    ledger: Ledger  # how this rank's own pass runs its collectives

    def do_collectives_run(self, m: dict) -> dict:
        """How many of this rank's collectives its pass has run with its peers (`ran`: for real, or recorded in the
        trace it was opened from), and the process groups other than the world's its collectives run on that this
        rank lacks (`lacking`: a rank opened from its trace makes none, its model's build() never runs)."""
        s = self.session
        if s.trace_reader is None:
            return {"ran": self.ledger.calls, "lacking": []}
        world = dist.group.WORLD.group_name
        return {"ran": sum(1 for c in self.collectives if c.tick < s.tl.frontier),
                "lacking": sorted({c.group for c in self.collectives if c.group != world})}

    def do_reference_ready(self, m: dict) -> bool:
        """Has this rank run its reference pass of the pass it holds now?"""
        return self.session.reference_current()

    def do_reference(self, m: dict) -> str:
        """Run this rank's reference pass anew, every collective for real with its peers' reference passes (which
        run now: the coordinator asks every rank at once); the reference's spec."""
        self.session.reference_forensics = None
        if self.session.trace_reader is not None:
            self._recorded_collectives()
        f = Forensics(self.session)  # a rank's launch names no reference: a driver's pass (torch:cpu:float64)
        f.collectives = Ledger(self.rank, lockstep=True).run
        f.reference  # runs the pass
        self.session.reference_forensics = f
        return f.spec

    def do_forensics(self, m: dict) -> dict:
        """This rank's first divergence from tick `start` on; the number of the collective it is at (None: a node
        of this rank's own); and for each collective, how its inputs on this rank compare with the reference."""
        f = self._reference()
        found = f.first_divergence(int(m["start"]))
        while found is not None and (c := self._collective_at(found.tick)) is not None \
                and not self._inputs(f, c)["within"]:  # its input on this rank brought the error: inherited
            found = f.first_divergence(found.tick + 1)
        at = self._collective_at(found.tick) if found is not None else None
        divergence = found.to_dict() if found is not None else None
        if divergence is not None and at is not None:
            divergence.update(introduced=None, introducedReason=CARRIED)
        return {"reference": f.spec, "divergence": divergence, "collective": at.number if at is not None else None,
                "inputs": self.do_collective_inputs(m)}

    def do_collective_inputs(self, m: dict) -> list[dict]:
        """For each of this rank's collectives, how its inputs on this rank compare with the reference."""
        f = self._reference()
        return [self._inputs(f, c) for c in self.collectives]

    def _recorded_collectives(self) -> None:
        """Forensics reruns this pass's nodes on the reference's inputs, its collectives among them: opened from its
        trace, this rank's ledger gives each the result the trace holds, as a live rank's gives the one it recorded
        when it ran (none runs again alone)."""
        tl = self.session.tl
        for c in self.collectives:
            node = tl.node_at(c.tick)
            if c.tick < tl.frontier and node.index not in self.ledger.recorded:
                self.ledger.recorded[node.index] = [tl.value(name, c.tick + 1) for name in node.outputs]

    def _reference(self) -> Forensics:
        if not self.do_reference_ready({}):
            raise RewindError(f"rank {self.rank} has no reference pass of this run: ask every rank for forensics")
        return self.session.reference_forensics

    def _collective_at(self, tick: int) -> "Collective | None":
        return next((c for c in self.collectives if c.tick == tick), None)

    def _inputs(self, f: Forensics, c: "Collective") -> dict:
        """The worst of a collective's node-made floating inputs on this rank against the reference (an input or
        parameter is the reference's own start)."""
        program, node = self.session.program, self.session.tl.node_at(c.tick)
        compared = [cmp for name in node.input_names() if (p := program.values[name].producer) is not None
                    for cmp in f.observed(program.nodes[p]) if cmp.value == name]
        if not compared:
            return {"value": None, "within": True, "error": 0.0,
                    "valueReason": "no input of it is made by a node: inputs and parameters start as the reference's"}
        worst = max(compared, key=lambda cmp: cmp.error)
        return {"value": worst.value, "within": worst.within, "error": worst.error}


# -- the coordinator's part ----------------------------------------------------------------------------------
def forensics(ranks: Ranks, start: Any = 0) -> dict:
    """Every rank's first divergence from its own tick `start` on against the float64 reference of the same ranks
    (a finding with `rank` and `carriedBy`, or None with `divergenceReason`), and the root: the earliest finding not
    carried by a collective (`divergence`, with `headline`)."""
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise RewindError(f"start is a tick to look from, a whole number from 0; got {echo(repr(start))}")
    reference_passes(ranks)
    answers = ranks.ask_all({"op": "forensics", "start": start}, "comparing its pass with its reference")
    found = [_rank_finding(ranks, r, answers, start) for r in sorted(answers)]
    roots = sorted((f for f in found if f["divergence"] is not None and f["divergence"]["carriedBy"] is None),
                   key=lambda f: (_before(ranks, f["rank"], f["divergence"]["tick"]), f["rank"]))
    out = {"reference": answers[0]["reference"], "ranks": found}
    if not roots:
        return {**out, "divergence": None, "headline": None,
                "divergenceReason": f"no rank introduces an error beyond the reference's tolerance from tick {start} "
                                    "on (a divergence carried by a collective names the ranks it came from)",
                "headlineReason": "no divergence"}
    root = roots[0]["divergence"]
    return {**out, "divergence": root, "headline": _headline(root, found)}


def reference_passes(ranks: Ranks) -> None:
    """Every rank's float64 reference pass of the run it holds: run now, on every rank at once, unless each has kept
    its own from before (refused before every rank has run each of its collectives with its peers)."""
    if all(ranks.ask_all({"op": "reference_ready"}, "answering whether it has a reference pass").values()):
        return  # kept from before, when they were checked
    _check_ran(ranks)
    ranks.ask_all({"op": "reference"}, "running its float64 reference pass with its peers")


def carried_into(ranks: Ranks, rank: int) -> dict[str, dict]:
    """What brought the error into each of rank `rank`'s collectives, by its node (the reference passes have run):
    `carriedBy` (the collective and the ranks whose inputs to it are beyond tolerance), or null with
    `carriedByReason` (every rank's input is within: the collective's own arithmetic)."""
    inputs = ranks.ask_all({"op": "collective_inputs"}, "comparing its collectives' inputs with its reference")
    return {c.node: _carried(ranks, rank, c.number, inputs) for c in ranks.collectives(rank)}


def _check_ran(ranks: Ranks) -> None:
    """The reference passes run every collective together, so each rank must have run every one of its own with its
    peers (then they matched one by one, and the test pass needs none run again), live or in the recording it was
    opened from; and each must have the process groups they run on."""
    ran = ranks.ask_all({"op": "collectives_run"}, "counting the collectives it has run")
    for r in sorted(ran):
        if ran[r]["lacking"]:
            name = ran[r]["lacking"][0]
            members = ", ".join(str(q) for q in ranks.groups.get(name, ()))
            raise RewindError(f"forensics of ranks opened from their traces runs the reference passes' collectives "
                              f"on the world's process group only, and rank {r}'s collectives run on process group "
                              f"'{name}' (ranks {members}), which ranks opened from traces do not make (their "
                              "model's build() does not run): launch the program with ranks instead")
    for r in sorted(ran):
        total = len(ranks.collectives(r))
        if ran[r]["ran"] < total:
            raise RewindError(f"forensics compares each rank's whole pass with its reference: run every rank to the "
                              f"end of its program first (rank {r} has run {ran[r]['ran']} of its {total} "
                              "collective(s))")


def _rank_finding(ranks: Ranks, r: int, answers: dict[int, dict], start: int) -> dict:
    answer = answers[r]
    found = answer["divergence"]
    if found is None:
        return {"rank": r, "divergence": None, "divergenceReason": f"no node of rank {r} from tick {start} on leaves "
                "the reference's tolerance by error it introduced, crossed the line at, or a collective carried in"}
    number = answer["collective"]
    carried_in = {"carriedBy": None, "carriedByReason": f"a node of rank {r}'s own introduced the error: no collective "
                  "carried it in"}
    if number is not None:
        carried_in = _carried(ranks, r, number, {p: a["inputs"] for p, a in answers.items()})
    return {"rank": r, "divergence": {**found, "rank": r, **carried_in}}


def _carried(ranks: Ranks, r: int, number: int, inputs: dict[int, list[dict]]) -> dict:
    """`carriedBy` of rank `r`'s collective #`number`, from each rank's inputs to its collectives (by rank), or null
    with `carriedByReason`."""
    c = ranks.collectives(r)[number - 1]
    group = {r: number, **ranks.senders(r, number)}  # each rank's collective that brings data in: its number
    compared = [{"rank": p, **inputs[p][n - 1]} for p, n in sorted(group.items()) if p in inputs]
    beyond = [i["rank"] for i in compared if not i["within"]]
    if not beyond:
        return {"carriedBy": None, "carriedByReason": f"every rank's input to {c.describe()} is within tolerance: the "
                                                      "collective's own arithmetic made the error"}
    if c.point_to_point:  # a recv: the send that carried the error in is named, on its rank
        c = ranks.collectives(beyond[0])[group[beyond[0]] - 1]
    return {"carriedBy": {**c.carrier(beyond[0]), "from": beyond, "inputs": compared}}


def _before(ranks: Ranks, r: int, tick: int) -> int:
    """How many of rank `r`'s collectives run before its tick `tick`."""
    return sum(1 for c in ranks.collectives(r) if c.tick < tick)


def _headline(root: dict, found: list[dict]) -> str:
    """The root in one sentence, with the collectives that carried its error to other ranks."""
    source = root["source"]
    where = f" at {os.path.basename(source['file'])}:{source['line']}" if source else ""
    words = f"rank {root['rank']} introduces the error{where} (`{root['node']}`)"
    carried: dict[str, list[int]] = {}
    for f in found:
        d = f["divergence"]
        if d is not None and d["carriedBy"] is not None and root["rank"] in d["carriedBy"]["from"]:
            c = d["carriedBy"]
            carried.setdefault(f"{c['collective']} #{c['number']} at {c['source']}", []).append(f["rank"])
    for collective, to in carried.items():
        words += f"; {collective} carried it to rank{'s' if len(to) > 1 else ''} {', '.join(str(t) for t in to)}"
    return words
