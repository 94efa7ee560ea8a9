"""Cross-rank numerics (docs/ranks.md, "Cross-rank numerics"): where a NaN/Inf was born when a collective carried it
from a peer, and the replicas check (values that must stay identical on every rank).

A rank's NaN/Inf filter stops it after a write that made a NaN/Inf its inputs did not carry. When that write is a
collective's, the value came from a peer: the coordinator asks each peer whether its input to the same collective
carried it and, if so, where it was born there (the first write upstream of the collective that the filter's own
test calls a birth, read from the peer's write log), and says so: "born on rank 1 at model.py:40; all_reduce at
model.py:52 carried it to rank 0". A stop at the birth itself names the collective downstream that will carry it.

The replicas check compares, after each forward motion of the ranks, the digests the write log keeps for every
write of the values named in `replicas` (the k-th write of a value on one rank against the k-th on every other),
and stops at the first write where they differ, every rank right after its own write: it names the value, the ranks
on each side, how much they differ, and the first node on the way to it where the ranks' values differ (walking
back from the value through the inputs whose digests differ, to the node whose inputs all agree). A replica is
written at its producer's tick, which each rank says once: a motion that passes none of them asks the ranks nothing.

RankNumerics is the part a rank's engine answers (hardware/ranks/worker.py); the functions below it, the
coordinator's part.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hardware.errors import RewindError, echo
from hardware.events import ExceptionDetails
from hardware.jsonable import json_safe
from hardware.program import Program
from hardware.ranks.collectives import typed
from hardware.source_names import source_scopes
from hardware.ticks import Stop, Tick
from provenance.births import node_dict
from provenance.lineage import descendants, lineage
from provenance.steps import op_name

if TYPE_CHECKING:
    from hardware.ranks.collectives import Collective
    from hardware.session.session import Session

REPLICAS = "replicas"  # the exception filter of the replicas check's stops
NONFINITE = ("nan", "inf")
MAX_LINEAGE = 256  # nodes upstream of a drifting replica whose values are compared across ranks
_KIND_WORDS = {"nan": "NaN", "inf": "Inf"}
_FACTS_ONLY = ("tick", "collective", "next")  # what a rank's facts tell the coordinator, beside its details
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # an integer view of each element width


class Ranks(Protocol):
    """What the coordinator's part uses of the Coordinator (which imports this module)."""

    world_size: int

    def ask(self, rank: int, message: dict, doing: str) -> Any: ...
    def ask_all(self, message: dict, doing: str) -> dict[int, Any]: ...
    def collectives(self, rank: int) -> list["Collective"]: ...
    def partners(self, rank: int, number: int) -> dict[int, int]: ...
    def senders(self, rank: int, number: int) -> dict[int, int]: ...
    def receivers(self, rank: int, number: int) -> dict[int, int]: ...
    def ticks(self) -> dict[int, int]: ...
    def goto(self, tick: int, rank: int = 0, replicas: bool = True) -> Any: ...
    def tensor(self, rank: int, name: str) -> dict: ...


# -- what a rank answers -------------------------------------------------------------------------------------
class RankNumerics:
    """The requests about numerics a rank's engine answers (mixed into RankEngine)."""

    rank: int
    session: "Session"
    collectives: list["Collective"]

    def do_exception_filters(self, m: dict) -> list[str]:
        """The NaN/Inf (and other) exception filters this rank's motions stop on."""
        self.session.set_exception_filters(m["filters"])
        return sorted(self.session.exception_filters)

    def at_fence(self, stop: Stop) -> bool:
        """The stop is at a fence (only the function breakpoints before the collectives made it)."""
        return bool(stop.breakpoint_ids) and set(stop.breakpoint_ids) <= self.session.fences  # its fences' ids

    def unhidden(self, stop: Stop) -> Stop:
        """A forward stop at a fence (the function breakpoint before a collective) hides a NaN/Inf the step before
        it made (the Session reports a position's breakpoint before its exception): the exception stop it hid."""
        s, q = self.session, int(stop.tick)
        if q == 0 or not self.at_fence(stop):
            return stop
        details = s.nonfinite_at(Tick(q - 1), s.exception_filters & set(NONFINITE))
        if details is None:
            return stop
        details.evidence = s.forensics.explain(details, q - 1)
        return Stop("exception", stop.tick, details.description(), exception=details)

    def exception_facts(self, stop: Stop) -> dict | None:
        """A NaN/Inf stop as the coordinator reads it: the rank's exception details, the write's tick, the number of
        the collective that wrote it (None: a node of this rank's own), and the number of the first collective
        downstream of the write (None: none is)."""
        d = stop.exception
        if d is None or d.filter not in NONFINITE:
            return None
        tick = int(stop.tick) - 1  # an exception stop is right after its write
        node = self.session.tl.node_at(tick)
        collective = next((c.number for c in self.collectives if c.tick == tick), None)
        nxt = None
        if node is not None and collective is None:
            after = set(descendants(self.session.program, node.index))
            nxt = next((c.number for c in self.collectives if self.session.tl.node_at(c.tick).index in after), None)
        return {**details_dict(d), "tick": tick, "collective": collective, "next": nxt}

    def do_birth(self, m: dict) -> dict | None:
        """Did this rank's input to its collective #number carry a `kind` (nan, inf)? None when not; else where it
        was born: the first write upstream of the collective that made one its inputs did not carry, or the input or
        parameter that held it from the start."""
        s, kind = self.session, m["kind"]
        c = self.collectives[int(m["number"]) - 1]
        node = s.tl.node_at(c.tick)
        carrying = [n for n in node.input_names() if s.value_stats(n, c.tick)[kind]]
        if not carrying:
            return None
        upstream = {i for name in carrying for i in lineage(s.program, name).nodes}
        after = -1
        while (rec := s.tl.log.first_nonfinite(after, nan=kind == "nan", inf=kind == "inf")) is not None:
            if rec.tick >= c.tick:
                break
            after = rec.tick
            born = s.nonfinite_at(rec.tick, (kind,)) if rec.node in upstream else None
            if born is not None:  # `collective`: it came from a peer through an earlier collective of this rank's
                return {"tick": rec.tick, "node": born.node, "op": born.op, "source": short(born.source),
                        "value": born.value, "count": born.count,
                        "collective": next((k.number for k in self.collectives if k.tick == rec.tick), None)}
        roots = [r for name in carrying for r in lineage(s.program, name).roots + [name]
                 if s.program.values[r].producer is None and s.value_stats(r, 0)[kind]]
        return {"root": roots[0] if roots else carrying[0]}

    def do_replicas(self, m: dict) -> dict:
        """The Program values `patterns` name, each with the name it was asked by (`replica_values`) and the tick of
        its write (its producer's); the patterns that name nothing, and those that name only values no node writes
        (inputs, parameters never updated)."""
        program, node_tick = self.session.program, self.session.tl.node_tick
        values: dict[str, str] = {}
        unmatched, unwritten = [], []
        for pattern in m["patterns"]:
            named = replica_values(program, pattern)
            if named is None:
                unmatched.append(pattern)
            elif not named:
                unwritten.append(pattern)
            else:
                values.update({v: label for v, label in named.items() if v not in values})
        ticks = {v: node_tick[program.values[v].producer] for v in values}
        return {"values": values, "ticks": ticks, "unmatched": unmatched, "unwritten": unwritten}

    def do_replica_writes(self, m: dict) -> list[list]:
        """[value, tick, digest] of every write of `values` from tick `since` to before tick `before` (this rank's:
        as far as the coordinator has seen it go, which a motion back since then leaves recorded)."""
        tl, me = self.session.tl, str(self.rank)
        since, before = int(m["since"][me]), int(m["before"][me])
        out = [[rec.value, rec.tick, self._digest(rec.value, rec.tick + 1) if rec.kind == "view" else rec.digest]
               for v in m["values"] for rec in tl.log.history(v, before=before, since=since)]
        return sorted(out, key=lambda w: w[1])

    def do_drift(self, m: dict) -> dict:
        """The values upstream of `value` at the position, each with its digest; a node's output with its inputs
        and its node (name, op, source line, tick), an input or parameter with none."""
        s, program = self.session, self.session.program
        seen = lineage(program, m["value"], MAX_LINEAGE)
        out = {}
        for name in [m["value"]] + seen.values:
            producer = program.values[name].producer
            entry: dict[str, Any] = {"digest": self._digest(name, s.tl.position), "node": None}
            if producer is not None and producer in seen.nodes:
                node = program.nodes[producer]
                entry.update(node_dict(node), name=op_name(node), tick=s.tl.node_tick[producer],
                             inputs=node.input_names())
            out[name] = entry
        return out

    def _digest(self, name: str, position: int) -> int:
        """The digest of a value at a position, as the write log's are computed (a view's and an input's: now)."""
        tl = self.session.tl
        rec = tl.log.last_writer(value=name, before=position)
        if rec is not None and rec.kind != "view":
            return rec.digest
        return tl.driver.inspect(tl.value(name, position)).digest


def replica_values(program: Program, pattern: str) -> dict[str, str] | None:
    """The values a node writes that `pattern` (a name or an fnmatch pattern) names, each with the name it was named
    by: source variables anywhere in the program (every value they are bound to), Program values and parameter
    paths (`l1.weight`); a parameter updated in place is compared at the value written into it. None when the
    pattern names nothing at all."""
    scopes = source_scopes(program)
    variables = sorted({e.name for inst in scopes.instances for e in inst.events})
    named = {v: var for var in variables if fnmatch.fnmatchcase(var, pattern) for v in scopes.bindings(var)}
    named.update({v: v for v, info in program.values.items() if v not in named and (
        fnmatch.fnmatchcase(v, pattern) or (info.target and fnmatch.fnmatchcase(info.target, pattern)))})
    if not named:
        return None
    written_into: dict[str, list[str]] = {}
    for produced, buffer in program.buffer_mutations.items():
        written_into.setdefault(buffer, []).append(produced)
    out = {}
    for value, label in named.items():
        for v in written_into.get(value, [value]):
            if program.values[v].producer is not None:
                out.setdefault(v, label)
    return out


def details_dict(d: ExceptionDetails) -> dict:
    return {"filter": d.filter, "node": d.node, "op": d.op, "source": d.source, "value": d.value, "count": d.count,
            "firstIndex": list(d.first_index) if d.first_index is not None else None, "inputs": d.inputs,
            "evidence": d.evidence, "context": d.context}


def exception_details(d: dict) -> ExceptionDetails:
    """The ExceptionDetails of a cut's `exception` (as details_dict wrote it)."""
    first = d.get("firstIndex")
    return ExceptionDetails(d["filter"], d["node"], d["op"], d["source"], d["value"], d["count"],
                            tuple(first) if first is not None else None, d["inputs"], d["evidence"], d["context"])


def short(source: str | None) -> str | None:
    """file.py:LINE of a path:LINE."""
    return os.path.basename(source) if source else None


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


# -- a NaN/Inf across ranks (the coordinator's part) -----------------------------------------------------------
def explained(coordinator: Ranks, rank: int, said: str, replies: dict[int, dict]) -> tuple[str, dict] | None:
    """Rank `rank`'s NaN/Inf stop (`said`: its words), with where the value was born across ranks: a collective's
    write, traced to the peers whose input carried it; a birth on the rank, with the collective downstream that
    will carry it on. Returns the stop's words and its exception, or None for a stop of another kind."""
    facts = replies[rank]["stop"].get("exception")
    if facts is None:
        return None
    try:
        story = _next_carrier(coordinator, rank, facts) if facts["collective"] is None else (
            _carried(coordinator, rank, facts, replies))
    except RewindError:  # a peer that cannot say (gone, busy): the rank's own words stay, and it is said later
        return None
    if story is None:
        return None
    words, found = story
    exception = {k: v for k, v in facts.items() if k not in _FACTS_ONLY}
    exception.update(evidence={**facts["evidence"], "message": words, **found}, context=words)
    return f"rank {rank}: {_KIND_WORDS[facts['filter']]} {words} ({said})", exception


def _carried(coordinator: Ranks, rank: int, facts: dict, replies: dict[int, dict]) -> tuple[str, dict]:
    """The words and evidence of a NaN/Inf a collective (or a recv) carried into the ranks that stopped at it."""
    kind, number = facts["filter"], facts["collective"]
    group = coordinator.partners(rank, number)  # the collective on each rank that takes part: rank -> its number
    to = sorted(r for r, n in group.items() if r in replies
                and (replies[r]["stop"].get("exception") or {}).get("collective") == n
                and replies[r]["stop"]["exception"]["filter"] == kind)
    senders = {q: n for q, n in coordinator.senders(rank, number).items() if q not in to}
    sources, sender = {}, None  # where it was born, by rank; the first sender whose input carried it
    for q, n in sorted(senders.items()):
        found = _births(coordinator, {q: n}, kind, set())
        sender = q if found and sender is None else sender
        sources.update(found)
    c = coordinator.collectives(rank)[number - 1]
    if c.point_to_point and sources:  # a recv: the send that carried it is named, on its rank
        c = coordinator.collectives(sender)[senders[sender] - 1]
    carried = c.carrier(sender)
    if not sources:
        words = f"made by {c.op} at {c.where} itself on {ranks_text(to)}: no rank's input to it carried one"
        return words, {"born": [], "carriedBy": carried, "carriedTo": to}
    by_place: dict[str, list[int]] = {}
    for r, b in sources.items():
        place = f"at {b['source']}" if "root" not in b else f"in its input '{b['root']}'"
        place += f" (relayed by rank {b['relayedBy']})" if "relayedBy" in b else ""
        by_place.setdefault(place, []).append(r)
    born = " and ".join(f"on {ranks_text(rs)} {place}" for place, rs in by_place.items())
    words = f"born {born}; {c.op} at {c.where} carried it to {ranks_text(to)}"
    return words, {"born": [{"rank": r, **b} for r, b in sources.items()], "carriedBy": carried, "carriedTo": to}


def _births(coordinator: Ranks, peers: dict[int, int], kind: str, seen: set[tuple[int, int]]) -> dict[int, dict]:
    """Where the `kind` each of `peers` (rank -> the number of its collective) sent into its collective was born, by
    rank; a peer that had it from an earlier collective (or recv) itself is followed to the ranks that sent it into
    that one, and named as the rank that relayed it (`seen`: the collectives followed, by rank and number)."""
    found = {}
    for r, number in sorted(peers.items()):
        b = coordinator.ask(r, {"op": "birth", "number": number, "kind": kind}, "finding where a NaN/Inf was born")
        if b is None:
            continue
        earlier = b.pop("collective", None)
        if earlier is not None and (r, earlier) not in seen:
            deeper = _births(coordinator, coordinator.senders(r, earlier), kind, seen | {(r, earlier)})
            if deeper:
                found.update({q: {**d, "relayedBy": d.get("relayedBy", r)} for q, d in deeper.items()})
                continue
        found[r] = b
    return dict(sorted(found.items()))


def _next_carrier(coordinator: Ranks, rank: int, facts: dict) -> tuple[str, dict] | None:
    if facts["next"] is None:
        return None
    c = coordinator.collectives(rank)[facts["next"] - 1]
    peers = sorted(coordinator.receivers(rank, c.number))
    words = f"born on rank {rank} at {short(facts['source'])}; {c.op} at {c.where} will carry it to {ranks_text(peers)}"
    found = {"born": [{"rank": rank, "tick": facts["tick"], "node": facts["node"], "op": facts["op"],
                       "source": short(facts["source"]), "value": facts["value"], "count": facts["count"]}],
             "carriedBy": c.carrier(rank), "carriedTo": peers}
    return words, found


def checked_filters(filters: Any) -> list[str]:
    if not isinstance(filters, (list, tuple, set)) or not all(isinstance(f, str) for f in filters):
        raise RewindError(f"exception filters are a list of names (nan, inf, …); got {echo(repr(filters))}")
    return list(filters)


# -- the replicas check (the coordinator's part) ---------------------------------------------------------------
class ReplicaCheck:
    """The values that must stay identical on every rank, the ticks each rank writes them at, and every rank's writes
    of them read so far (`reads`: how many times the ranks were asked for them)."""

    def __init__(self, coordinator: Ranks, patterns: Any):
        if (not isinstance(patterns, (list, tuple)) or not patterns
                or not all(isinstance(p, str) and p.strip() for p in patterns)):
            raise RewindError(f"replicas is a list of value names or patterns (such as [\"updated\", \"w_*\"]) of "
                              f"values that must be identical on every rank; got {echo(repr(patterns))}")
        self.patterns = list(patterns)
        named = coordinator.ask_all({"op": "replicas", "patterns": self.patterns}, "finding the replicas")
        for key, words in (("unmatched", "names no variable, parameter or value of the program"),
                           ("unwritten", "names only parameters or inputs, which no node writes: name a value "
                                         "computed from them (a parameter after its update)")):
            for p in self.patterns:
                rs = [r for r in sorted(named) if p in named[r][key]]
                if rs:
                    where = "" if len(rs) == coordinator.world_size else f" of {ranks_text(rs)}"
                    raise RewindError(f"replicas: '{echo(p)}' {words}{where}")
        first = named[0]["values"]
        self.labels = {v: label for v, label in first.items() if all(v in named[r]["values"] for r in named)}
        if not self.labels:
            raise RewindError("replicas: no value they name is on every rank (the ranks' programs differ there)")
        # a replica's write sits at its producer's tick on each rank: a motion that passes none has nothing to compare
        self._ticks = {r: sorted(named[r]["ticks"][v] for v in self.labels) for r in named}
        self._writes: dict[int, dict[str, list[tuple[int, int]]]] = {r: {v: [] for v in self.labels} for r in named}
        self._fetched = {r: 0 for r in named}  # each rank's writes before this tick are in _writes
        self._reached = {r: 0 for r in named}  # the furthest each rank's checked motions took it
        self._agreed = {v: 0 for v in self.labels}  # each value's leading writes every rank made, with one digest
        self.reads = 0

    def check(self, coordinator: Ranks, before: dict[int, int]) -> tuple[str, int, dict | None] | None:
        """After a forward motion from `before` (each rank's tick): the first write of a replica made in it where
        the ranks differ, every rank put right after its own write of it, as (words, the rank the stop is about,
        the exception); None when they agree. A rank that cannot be put there (gone, silent) is the stop instead,
        with no exception: the coordinator's finding."""
        after = coordinator.ticks()
        self._reached = {r: max(t, after[r]) for r, t in self._reached.items()}
        if not any(_passes(ticks, before[r], after[r]) for r, ticks in self._ticks.items()):
            return None
        if self._fetched != self._reached:
            self._fetch(coordinator)
        found = self._first_drift(before, after)
        if found is None:
            return None
        value, ticks, digests = found
        for r in sorted(ticks):
            stop = coordinator.goto(ticks[r] + 1, r, replicas=False)  # a goto forward would check them again
            if stop.reason == "exception":  # goto's own finding: a rank gone or silent, or a mismatch on the way
                return stop.description, stop.rank, None
        return _drift_stop(coordinator, value, self.labels[value], ticks, digests)

    def _fetch(self, coordinator: Ranks) -> None:
        """Every rank's writes of the replicas not read yet, up to where its motions have taken it."""
        message = {"op": "replica_writes", "values": list(self.labels), "since": self._fetched,
                   "before": self._reached}
        self.reads += 1
        for r, writes in coordinator.ask_all(message, "reading the replicas' writes").items():
            for value, tick, digest in writes:
                self._writes[r][value].append((tick, digest))
        self._fetched = dict(self._reached)

    def _first_drift(self, before: dict[int, int], after: dict[int, int]) -> tuple | None:
        """(value, each rank's tick of the write, each rank's digest) of the earliest write made in the motion whose
        digests differ, compared where every rank has made it. A value's leading writes that every rank made with
        one digest never differ: the comparison starts after them."""
        best = None
        for value in self.labels:
            seqs = {r: w[value] for r, w in self._writes.items()}
            for k in range(self._agreed[value], min(len(s) for s in seqs.values())):
                writes = {r: s[k] for r, s in seqs.items()}
                if len({d for _, d in writes.values()}) == 1:
                    if k == self._agreed[value]:
                        self._agreed[value] = k + 1
                    continue
                if any(before[r] <= t < after[r] for r, (t, _) in writes.items()):
                    when = min(t for t, _ in writes.values())
                    if best is None or when < best[0]:
                        best = (when, value, {r: t for r, (t, _) in writes.items()},
                                {r: d for r, (_, d) in writes.items()})
                    break
        return best[1:] if best is not None else None


def _passes(ticks: list[int], start: int, end: int) -> bool:
    """Whether a motion from tick `start` to `end` ran any of `ticks` (sorted)."""
    i = bisect.bisect_left(ticks, start)
    return i < len(ticks) and ticks[i] < end


def _drift_stop(coordinator: Ranks, value: str, label: str, ticks: dict[int, int],
                digests: dict[int, int]) -> tuple[str, int, dict]:
    """The words, the rank and the exception of a stop where the ranks' writes of a replica differ (`digests`): the
    larger side of the ranks agrees, the others differ from it."""
    sides: dict[int, list[int]] = {}
    for r in sorted(digests):
        sides.setdefault(digests[r], []).append(r)
    agree = max(sides.values(), key=lambda rs: (len(rs), -rs[0]))
    differ = sorted(r for r in digests if r not in agree)
    graphs = coordinator.ask_all({"op": "drift", "value": value}, "tracing where the replicas differ")
    mine = graphs[differ[0]]
    first, way, local = first_difference(graphs, differ[0], value)
    amount = _amount(coordinator, value, agree[0], differ)
    shown = f"'{label}'" + (f" ({value})" if label != value else "")
    how = amount.get("amountReason") or (f"max abs difference {amount['maxAbsDifference']:.3g}, first at element "
                                         f"{tuple(amount['firstIndex'])}, {amount['count']} of {amount['elements']} "
                                         "element(s)")
    reads = f" (it reads {', '.join(repr(v) for v in local)}, which differ between the ranks)" if local else ""
    words = (f"replicas differ: {shown} written by {_where(mine[value])} on {ranks_text(differ)} differs from "
             f"{ranks_text(agree)} ({how}); the first node where they differ: {_where(mine[first])}{reads}")
    evidence = json_safe({
        "message": words, "value": value, "name": label, "ticks": ticks, "agree": agree, "differ": differ,
        "digests": {r: f"{d & 0xFFFFFFFFFFFFFFFF:016x}" for r, d in digests.items()}, **amount,
        "firstDifference": {"value": first, **_node_of(mine[first]), "tick": mine[first]["tick"], "reads": local},
        "differingOnTheWay": [{"value": v, **_node_of(mine[v])} for v in way]})
    written = mine[value]
    exception = {"filter": REPLICAS, "node": written["node"], "op": written["op"], "source": written["source"],
                 "value": value, "count": amount["count"], "firstIndex": amount["firstIndex"], "inputs": {},
                 "evidence": evidence, "context": ""}
    return words, differ[0], exception


def _node_of(entry: dict) -> dict:
    """A node of a drift graph as JSON names it (births.node_dict's fields)."""
    return {k: entry[k] for k in ("node", "op", "source", "sourceReason") if k in entry}


def _where(entry: dict) -> str:
    """`mul at model.py:21`: a node of a drift graph for a person."""
    return f"{entry['name']} at {short(entry['source'])}" if entry["source"] else f"{entry['name']} ('{entry['node']}')"


def first_difference(graphs: dict[int, dict], rank: int, value: str) -> tuple[str, list[str], list[str]]:
    """Where the ranks' values first differ on the way to `value` (which differs), read on rank `rank`'s graph:
    walking back through the node outputs whose digests differ, the earliest node whose node-made inputs all
    agree; the differing node outputs on the way (in execution order), and the inputs or parameters that node
    reads that differ."""
    mine = graphs[rank]

    def differs(name: str) -> bool:
        return all(name in g for g in graphs.values()) and len({g[name]["digest"] for g in graphs.values()}) > 1

    def made(name: str) -> bool:
        return mine.get(name, {}).get("node") is not None

    way, stack, seen = [], [value], {value}
    while stack:
        name = stack.pop()
        way.append(name)
        for i in mine[name]["inputs"]:
            if i not in seen and made(i) and differs(i):
                seen.add(i)
                stack.append(i)
    way.sort(key=lambda n: mine[n]["tick"])
    first = next(n for n in way if not any(made(i) and differs(i) for i in mine[n]["inputs"]))
    local = [i for i in mine[first]["inputs"] if i in mine and not made(i) and differs(i)]
    return first, way, local


def _amount(coordinator: Ranks, value: str, agree: int, differ: list[int]) -> dict:
    """How much the first differing rank's value differs from an agreeing rank's (`difference`)."""
    try:
        a, b = (_tensor(coordinator.tensor(r, value)) for r in (agree, differ[0]))
    except RewindError as exc:
        return _by_digest(str(exc))
    return difference(a, b, agree, differ[0])


def difference(a: torch.Tensor, b: torch.Tensor, rank_a: int, rank_b: int) -> dict:
    """How much rank `rank_b`'s value `b` differs from rank `rank_a`'s `a`: the largest absolute difference, the first
    element that differs (bit for bit), how many do. Values of other shapes or dtypes, and elements wider than any
    integer view (complex128), are compared by digest only, the reason said."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return _by_digest(f"rank {rank_a} holds {_typed(a)}, rank {rank_b} {_typed(b)}")
    bits = _BITS.get(a.element_size())
    if bits is None:
        return _by_digest(f"the ranks hold {_typed(a)}, whose {a.element_size()}-byte elements are not compared bit "
                          "for bit")
    mask = a.reshape(-1).view(bits) != b.reshape(-1).view(bits)
    where = mask.nonzero()
    gap = (_wide(a) - _wide(b)).abs().reshape(-1)[mask]
    index = torch.unravel_index(where[0, 0], a.shape) if len(where) else ()
    return {"maxAbsDifference": float(gap.max()) if len(gap) else 0.0, "count": int(mask.sum()),
            "firstIndex": [int(i) for i in index] if len(where) else None, "elements": a.numel()}


def _by_digest(reason: str) -> dict:
    return {"maxAbsDifference": None, "firstIndex": None, "count": 0, "elements": 0,
            "amountReason": f"compared by digest only: {reason}"}


def _typed(t: torch.Tensor) -> str:
    """float32[4,8]: a value's dtype and shape, as a collective's tensors are written."""
    return typed(str(t.dtype).removeprefix("torch."), t.shape)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """A value in the widest dtype of its kind, where two values' difference is measured."""
    return t.to(torch.complex128) if t.is_complex() else t.double()


def _tensor(answer: dict) -> torch.Tensor:
    dtype = getattr(torch, answer["dtype"])
    data = bytearray(answer["bytes"])
    return torch.frombuffer(data, dtype=dtype).reshape(answer["shape"]) if data else torch.empty(0, dtype=dtype)
