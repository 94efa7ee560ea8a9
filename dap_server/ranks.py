"""A session of many ranks through DAP (docs/ranks.md; docs/protocol.md, "Many ranks"): each rank is a thread.

With `ranks` in the launch the adapter's session is a RankedSession (hardware/ranks/session.py). Motions, threads
and the lifecycle are the usual handlers over it: every rank moves, through consistent cuts. A request about one
rank's values is forwarded to that rank's engine, which answers it with the usual handler over its own Session
(dap_server/engine.py's RankAdapterEngine); its ids are made the session's own here: a frame id carries its
thread (rank + 1) as on any chip (frames.FRAMES_PER_THREAD), a variable reference is the adapter's and names the
rank's own, a memory reference or data id is the rank's own behind `rankN:`, a breakpoint id is the session's
(hardware/ranks/session.py's BreakpointIds). An edit is answered where it is sound (_edit); a request the ranks
cannot answer yet is refused in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from dap_server.events import working
from dap_server.frames import FRAMES_PER_THREAD, thread_unit
from dap_server.sources import source_path
from dap_server.variables import Fields, VariableTable
from hardware.errors import RewindError, echo
from hardware.ranks.forensics import CARRIED
from hardware.ranks.numerics import NONFINITE
from hardware.ranks.lines import bound_where_run, only_on
from hardware.ranks.session import RankedSession
from hardware.ticks import Direction

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it
    from dap_server.requests import Arguments, Handler

Answer = Callable[["RequestContext", "Arguments"], Any]

# Answered by the usual handler over the RankedSession.
USUAL = {"initialize", "launch", "attach", "configurationDone", "disconnect", "terminate", "cancel",
         "pause", "threads", "saveTrace"}  # saveTrace: each rank's trace beside the path, the index at it
_RANKS_OWN = ("memoryReference", "instructionPointerReference", "instructionReference", "dataId")  # name a rank's
_RANKED = re.compile(r"rank(\d{1,6}):(.*)", re.DOTALL)


@dataclass(frozen=True)
class RankReference:
    """A rank's own variablesReference, behind one of the adapter's."""

    rank: int
    ref: int


class RankVariables(VariableTable):
    """A rank engine's variable references: a value's `location` (its Placement's fields) names the rank."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def add(self, container: Any) -> int:
        if isinstance(container, Fields) and isinstance(container.data, dict) and "shards" in container.data:
            container = Fields(placed(container.data, self.rank))
        return super().add(container)


def placed(placement: dict, rank: int) -> dict:
    """A Placement's fields with its rank, on it and on each of its Locations: (rank, chip, address)."""
    return {"rank": rank, **placement, "shards": [{"rank": rank, **shard} for shard in placement["shards"]]}


def answer_for(handler: "Handler") -> Answer:
    """How a session of many ranks answers `handler`'s request."""
    if handler.command in USUAL:
        return handler.fn
    special = _SPECIAL.get(handler.command)
    if special is not None:
        return lambda adapter, args: special(adapter, args, handler)
    return lambda adapter, args: _refuse(handler.command)


def _refuse(command: str) -> None:
    raise RewindError(f"'{command}' is not supported with ranks yet (docs/ranks.md says what a session of many "
                      "ranks can do)")


# -- forwarding ----------------------------------------------------------------------------------------------
def _ask(adapter: "RequestContext", rank: int, command: str, arguments: dict) -> Any:
    message = {"op": "dap", "command": command, "arguments": arguments}
    return _ours(adapter, rank, adapter.session.ask(rank, message, f"answering {command}"))


def _ours(adapter: "RequestContext", rank: int, body: Any) -> Any:
    """A rank's answer with its ids made the session's: variable references the adapter's, memory references and
    data ids behind `rankN:`."""
    if isinstance(body, list):
        return [_ours(adapter, rank, item) for item in body]
    if not isinstance(body, dict):
        return body
    out = {}
    for key, value in body.items():
        if key == "variablesReference" and isinstance(value, int) and value > 0:
            out[key] = adapter.variables.add(RankReference(rank, value))
        elif key in _RANKS_OWN and isinstance(value, str):
            out[key] = f"rank{rank}:{value}"
        else:
            out[key] = _ours(adapter, rank, value)
    return out


def _their_reference(adapter: "RequestContext", reference: str, what: str) -> tuple[int, str]:
    """The rank a memory reference, data id or instruction reference of the session names (`rank1:…`), and the
    rank's own reference."""
    found = _RANKED.fullmatch(reference)
    if found is None:
        raise RewindError(f"{what} '{echo(reference)}' names no rank: with ranks it is rankN:… as the answer that "
                          "gave it says (a variable, locate, dataBreakpointInfo)")
    rank, count = int(found[1]), len(adapter.session.units())
    if rank >= count:
        raise RewindError(f"{what} '{echo(reference)}' names rank {rank}: this session has ranks 0..{count - 1}")
    return rank, found[2]


def _frame_rank(adapter: "RequestContext", frame_id: int | None) -> tuple[int, int | None]:
    """The rank a frame id is of, and the id its engine takes (the same: a rank reads a frame id's level only, and
    names the id as the client sent it); no frame: the rank the last stop is about."""
    if frame_id is None:
        stop = adapter.session.last_stop
        return (stop.unit or 0) if stop is not None else 0, None
    rank = (frame_id - 1) // FRAMES_PER_THREAD
    if frame_id < 1 or rank >= len(adapter.session.units()):
        raise RewindError(f"no frame {frame_id}: frames of thread t (rank t - 1) have ids from "
                          f"(t - 1) * {FRAMES_PER_THREAD} + 1")
    return rank, frame_id


def _target(adapter: "RequestContext", args: Any) -> tuple[int, dict]:
    """The rank a request is about, and its arguments as that rank's engine takes them: the rank of the memory
    reference, variable reference, frame or thread it names (each made the rank's own; the thread left out: a rank
    has one), else the rank the last stop is about. A tick a request names is its rank's."""
    arguments = args.model_dump(exclude_unset=True)
    thread = arguments.pop("threadId", None)
    ranks = []
    if isinstance(arguments.get("memoryReference"), str):
        rank, arguments["memoryReference"] = _their_reference(adapter, arguments["memoryReference"],
                                                              "memoryReference")
        ranks.append(rank)
    if arguments.get("variablesReference"):
        theirs = adapter.variables.get(arguments["variablesReference"])
        ranks.append(theirs.rank)
        arguments["variablesReference"] = theirs.ref
    if arguments.get("frameId") is not None:
        rank, arguments["frameId"] = _frame_rank(adapter, arguments["frameId"])
        ranks.append(rank)
    if thread is not None:
        ranks.append(thread_unit(adapter, thread))
    if len(set(ranks)) > 1:
        raise RewindError(f"the request names ranks {' and '.join(str(r) for r in sorted(set(ranks)))} (by its "
                          "references, frame or thread): name one")
    return (ranks[0] if ranks else _frame_rank(adapter, None)[0]), arguments


def _forward(adapter: "RequestContext", args: Any, handler: "Handler") -> Any:
    """scopes, variables, evaluate, stepInTargets, readMemory, disassemble, gotoTargets (its `threadId`, Rewind's: the
    rank whose ticks a goto on that thread then takes): asked of the rank _target names."""
    rank, arguments = _target(adapter, args)
    return _ask(adapter, rank, handler.command, arguments)


def _own(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """Rewind's own requests about one rank's values or timeline (provenance, writeHistory, valueAt, valueDiff,
    histogram, findTick, timeline, timelineEvents, checkpoints, units, listPatches): as _forward, the answer
    naming its rank (`rank`); `locate`'s Placement names it on every Location too. One that would run the rank
    past a collective its peers have not reached is refused by the rank in words (RankEngine.reading)."""
    rank, arguments = _target(adapter, args)
    body = _ask(adapter, rank, handler.command, arguments)
    return placed(body, rank) if handler.command == "locate" else {"rank": rank, **body}


def _timeline_events(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """timelineEvents of one rank (_own): a breakpoint's stop names the session's id of it (in its words too); the
    rank's stops at its fences (the breakpoints before its collectives, no breakpoint of the client's) are left out."""
    body = _own(adapter, args, handler)
    events = []
    for event in body["events"]:
        if event["event"] == "stop" and event["breakpoints"]:
            ids, theirs = adapter.session.breakpoint_ids, event["breakpoints"]
            event["breakpoints"] = ids.of(body["rank"], theirs)
            event["description"] = ids.named(body["rank"], event["description"], theirs)
            if not event["breakpoints"]:
                continue
        events.append(event)
    return {**body, "events": events}


def _stack_trace(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    rank = thread_unit(adapter, args.threadId)
    body = _ask(adapter, rank, "stackTrace", {**args.model_dump(exclude_unset=True), "threadId": 1})
    for frame in body["stackFrames"]:
        frame["id"] += rank * FRAMES_PER_THREAD
    return body


# -- breakpoints -----------------------------------------------------------------------------------------------
def _every_rank(adapter: "RequestContext", args: Any, handler: "Handler", again: bool = False) -> dict:
    """setBreakpoints, setFunctionBreakpoints, setExceptionBreakpoints: on every rank, each binding them to its own
    Program (a line where a node runs on some ranks binds on those only, moved on none: hardware/ranks/lines.py); a
    breakpoint is verified where any rank could bind it (its line and message are the first such rank's; a line's
    says the ranks it is not on), and has an id of the session's, which a stop on any rank names (`again`: set on a
    relaunch's new ranks, the id it had)."""
    adapter.require_launched()
    arguments = args.model_dump(exclude_unset=True)
    message = {"op": "dap", "command": handler.command, "arguments": arguments}
    answers = {r: a["breakpoints"] for r, a in adapter.session.ask_all(message, f"answering {handler.command}").items()}
    lines = handler.command == "setBreakpoints"
    if lines:
        answers = bound_where_run(answers, lambda keep: _set_lines(adapter, arguments, keep))
    same = list(zip(*(answers[r] for r in sorted(answers))))
    merged = [dict(next((bp for bp in on_ranks if bp.get("verified")), on_ranks[0])) for on_ranks in same]
    for bp, on_ranks in zip(merged, same):
        if lines and (said := only_on(on_ranks)) is not None:
            bp["message"] = said
    group = f"lines of {source_path(args.source)}" if lines else handler.command
    if handler.command != "setExceptionBreakpoints":  # filters have no ids
        ids = adapter.session.breakpoint_ids.assign(group, [{r: bp["id"] for r, bp in enumerate(on_ranks)
                                                             if bp.get("id") is not None} for on_ranks in same], again)
        for bp, session_id in zip(merged, ids):
            bp["id"] = session_id
    return _kept(adapter, group, handler, args, {"breakpoints": merged})


def _kept(adapter: "RequestContext", group: str, handler: "Handler", args: Any, answer: dict) -> dict:
    """`answer`, to `handler`'s request `args` that set the breakpoints of `group`: kept with it, so that a
    relaunch's new ranks are set them again (_set_again)."""
    adapter.session.breakpoints_set[group] = (handler, args, answer)
    return answer


def _set_again(adapter: "RequestContext") -> None:
    """After a relaunch (new ranks, which know none of the client's breakpoints): every kind set on them again as
    the client last set it, each breakpoint under the session's id the client has (a stop names it); one whose
    answer is not what the client was told (its verification, its line) is told in a `breakpoint` event, as a
    single session's Session keeps its breakpoints across a relaunch and binds them to the new Program."""
    for handler, args, told in list(adapter.session.breakpoints_set.values()):
        answer = _SPECIAL[handler.command](adapter, args, handler, again=True)
        for before, now in zip(told["breakpoints"], answer["breakpoints"]):
            if before.get("id") is not None and now != before:
                adapter.emit("breakpoint", {"reason": "changed", "breakpoint": now})


def _set_lines(adapter: "RequestContext", arguments: dict, keep: dict[int, list[int]]) -> dict[int, list[dict]]:
    """setBreakpoints (its `arguments`) asked again of the ranks in `keep`, each with only the breakpoints it keeps
    (their places in the asked list); their answers."""
    asked = arguments.get("breakpoints")
    asked = [{"line": n} for n in arguments.get("lines") or []] if asked is None else asked
    rest = {k: v for k, v in arguments.items() if k != "lines"}
    answers = adapter.session.ask_each({r: {"op": "dap", "command": "setBreakpoints", "arguments": {
        **rest, "breakpoints": [asked[i] for i in places]}} for r, places in keep.items()}, "answering setBreakpoints")
    return {r: a["breakpoints"] for r, a in answers.items()}


_NAMED_BY = {"setDataBreakpoints": "dataId", "setInstructionBreakpoints": "instructionReference"}


def _each_on_its_rank(adapter: "RequestContext", args: Any, handler: "Handler", again: bool = False) -> dict:
    """setDataBreakpoints, setInstructionBreakpoints: each breakpoint on the rank its dataId or instructionReference
    names (`rank1:…`), every rank's replaced (a rank named by none has none now); one that names no rank of the
    session is unverified, saying why, and never fails the batch. Each has an id as _every_rank's, unverified ones
    too: a relaunch on fewer or more ranks tells the client which of them it unverified or verified by that id."""
    adapter.require_launched()
    key = _NAMED_BY[handler.command]
    on_rank: dict[int, list[dict]] = {r: [] for r in range(len(adapter.session.units()))}
    where: list[tuple[int, int] | str] = []  # per breakpoint: (its rank, its place in the rank's list), or why not
    for bp in args.breakpoints:
        asked = bp.model_dump(exclude_unset=True)
        try:
            rank, asked[key] = _their_reference(adapter, asked[key], key)
        except RewindError as exc:
            where.append(str(exc))
            continue
        where.append((rank, len(on_rank[rank])))
        on_rank[rank].append(asked)
    answers = adapter.session.ask_each({r: {"op": "dap", "command": handler.command, "arguments": {"breakpoints": bps}}
                                        for r, bps in on_rank.items()}, f"answering {handler.command}")
    ids = adapter.session.breakpoint_ids.assign(handler.command, [
        {w[0]: answers[w[0]]["breakpoints"][w[1]]["id"]} if isinstance(w, tuple) else {} for w in where], again)
    out = []
    for w, session_id in zip(where, ids):
        if isinstance(w, str):
            out.append({"id": session_id, "verified": False, "message": w})
        else:
            out.append({**_ours(adapter, w[0], answers[w[0]]["breakpoints"][w[1]]), "id": session_id})
    return _kept(adapter, handler.command, handler, args, {"breakpoints": out})


def _data_breakpoint_info(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """Asked of the rank of the variable reference or frame (else of the stop's); its dataId names the rank."""
    rank, arguments = _target(adapter, args)
    body = _ask(adapter, rank, handler.command, arguments)
    if body.get("dataId") is not None:
        body["description"] = f"rank {rank}: {body['description']}"
    return body


def _lines_of_every_rank(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """breakpointLocations: the lines of the range where a node runs on any rank (a breakpoint binds on every rank
    that has one there)."""
    adapter.require_launched()
    message = {"op": "dap", "command": handler.command, "arguments": args.model_dump(exclude_unset=True)}
    answers = adapter.session.ask_all(message, f"answering {handler.command}")
    lines = sorted({bp["line"] for answer in answers.values() for bp in answer["breakpoints"]})
    return {"breakpoints": [{"line": line} for line in lines]}


def _exception_info(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """The coordinator's own finding (a mismatch, a rank that did not answer, replicas that differ) and a NaN/Inf
    traced across ranks (hardware/ranks/numerics.py) here; any other exception of a rank's own from that rank."""
    stop = adapter.session.last_stop
    rank = thread_unit(adapter, args.threadId)
    if stop is not None and stop.exception is not None and (  # a NaN/Inf stop is its rank's: a finding, every rank's
            stop.exception.filter not in NONFINITE or rank == (stop.unit or 0)):
        return handler.fn(adapter, args)
    return _ask(adapter, rank, "exceptionInfo", {"threadId": 1})


# -- edits -------------------------------------------------------------------------------------------------------
def _edit(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """setVariable, writeMemory: an edit of the rank its variable or memory reference names, a new step at its
    position. Sound where the rank's recorded future holds no collective it ran with its peers (at its frontier:
    running on runs every collective afresh, with every rank); elsewhere the rank refuses it in words, since what
    its peers recorded from it would be stale (hardware/ranks/worker.py's do_edit)."""
    rank, arguments = _target(adapter, args)
    message = {"op": "dap", "command": handler.command, "arguments": arguments}
    body = _ours(adapter, rank, adapter.session.edit(rank, message, f"answering {handler.command}"))
    if handler.command == "writeMemory" and body.get("bytesWritten") and adapter.client.memory_event:
        adapter.emit("memory", {"memoryReference": args.memoryReference, "offset": args.offset,
                                "count": body["bytesWritten"]})
    adapter.events.invalidate("variables")  # the rank's own adapter tells no client
    return body


def _no_patches(adapter: "RequestContext", args: Any, handler: "Handler") -> None:
    raise RewindError(f"'{handler.command}' is not supported with ranks: a patched pass runs its nodes again on one "
                      "rank, and a collective among them would need its peers, whose recorded results from it would "
                      "be stale (docs/ranks.md, \"Edits\")")


# -- motions -------------------------------------------------------------------------------------------------------
def _restart(adapter: "RequestContext", args: Any, handler: "Handler") -> None:
    """restart: the usual handler. Without arguments every rank goes back to its beginning, its breakpoints kept;
    with new launch arguments new ranks start (a program's or a trace index's), and the client's breakpoints are
    set on them again (_set_again) unless the relaunch has no ranks."""
    handler.fn(adapter, args)
    if args.arguments is not None and isinstance(adapter.session, RankedSession):
        _set_again(adapter)


def _every_thread(adapter: "RequestContext", args: Any, handler: "Handler") -> Any:
    """continue, next, stepIn, stepOut and their reverse: the usual handlers, every rank moving; with singleThread,
    the thread's rank alone (_one_rank); stepIn to a target, _step_into."""
    if getattr(args, "targetId", None) is not None:
        return _step_into(adapter, args)
    if args.singleThread and handler.command in _CONTINUES:  # the usual steps pass singleThread on themselves
        return _one_rank(adapter, args, handler)
    return handler.fn(adapter, args)


def _step_into(adapter: "RequestContext", args: Any) -> None:
    """stepIn to a target of stepInTargets (a tick of the thread's rank): that rank to the instant before the
    target's node, the others to the consistent cut around it (a collective on the way crosses with every rank);
    with singleThread, only a target before the rank's next collective."""
    rank = thread_unit(adapter, args.threadId)
    session, tick = adapter.session, args.targetId - 1
    if tick not in session.ask(rank, {"op": "step_in_targets"}, "listing its step-in targets"):
        raise RewindError(f"stepIn: target {args.targetId} is not a node still to run on rank {rank}'s line "
                          "(stepInTargets lists them, anew after every motion)")
    crossed = session.crossed(rank, tick) if args.singleThread else None
    if crossed is not None:
        raise RewindError(f"stepIn: rank {rank} alone cannot reach target {args.targetId}: it would cross "
                          f"{crossed.describe()}, which runs only with every rank (step in without singleThread)")
    adapter.resume(lambda: session.step_into(tick, rank), f"Stepping rank {rank} in")


_CONTINUES = {"continue": Direction.FORWARD, "reverseContinue": Direction.REVERSE}


def _one_rank(adapter: "RequestContext", args: Any, handler: "Handler") -> dict | None:
    """continue or reverseContinue of the thread's rank alone, the others staying where they are: up to its next
    collective at most, or back to right after its last; a rank waiting at one stays, and its stop says why
    (docs/ranks.md)."""
    rank = thread_unit(adapter, args.threadId)
    adapter.resume(lambda: adapter.session.run(_CONTINUES[handler.command], rank, single_thread=True),
                   f"Continuing rank {rank} alone")
    return {"allThreadsContinued": False} if handler.command == "continue" else None


def _stopped_rank(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """source, loadedSources: asked of the rank the last stop is about."""
    rank, _ = _frame_rank(adapter, None)
    return _ask(adapter, rank, handler.command, args.model_dump(exclude_unset=True))


def _goto(adapter: "RequestContext", args: Any, handler: "Handler") -> None:
    """The thread's rank to the target's tick; every other rank to the consistent cut around it."""
    rank = thread_unit(adapter, args.threadId)
    tick, end = args.targetId - 1, adapter.session.end_of(rank)
    if not 0 <= tick <= end:
        raise RewindError(f"goto target {args.targetId} is not a tick of rank {rank}'s program "
                          f"(targets are 1..{end + 1})")
    adapter.resume(lambda: adapter.session.goto(tick, rank), f"Going to tick {tick} of rank {rank}")


def _goto_step(adapter: "RequestContext", args: Any, handler: "Handler") -> None:
    """gotoStep: the rank _target names (its thread, else the last stop's) to the start of its training step `step`
    (each rank's Program is the step repeated), every other rank to the consistent cut around it; a step the run
    does not have is refused at once, naming the rank."""
    adapter.require_launched()
    rank, _ = _target(adapter, args)
    tick = adapter.session.step_start(args.step, rank)  # a step the run does not have: refused before any motion
    adapter.resume(lambda: adapter.session.goto_step(args.step, rank, tick), f"Going to step {args.step} of rank {rank}")


def _restore_checkpoint(adapter: "RequestContext", args: Any, handler: "Handler") -> None:
    """restoreCheckpoint: the rank _target names to its checkpoint at `tick` (one its `checkpoints` lists); its peers
    hold no checkpoint of that instant (each rank checkpoints its own Timeline), so they go to the consistent cut
    around it, as for goto."""
    adapter.require_launched()
    rank, _ = _target(adapter, args)
    ticks = [c["tick"] for c in _ask(adapter, rank, "checkpoints", {})["checkpoints"]]
    if args.tick not in ticks:
        raise RewindError(f"rank {rank} has no checkpoint at tick {args.tick}; its checkpoints: {ticks}")
    adapter.resume(lambda: adapter.session.restore(args.tick, rank),
                   f"Restoring rank {rank}'s checkpoint at tick {args.tick}")


_NO_ORIGIN = ("not traced with ranks: tracing it runs precision ablations, which re-run nodes on one rank, and a "
              "collective among them would need its peers")


def _first_divergence(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """firstDivergence: every rank's first divergence against a float64 reference of the same ranks (their reference
    passes run at once, each collective for real), in `ranks`, each finding with its `rank` and `carriedBy`; the
    root, the earliest not carried by a collective, in `divergence` (hardware/ranks/forensics.py)."""
    with working(adapter, "Looking for the first divergence on every rank"):
        found = adapter.session.forensics(args.start)
    why = _NO_ORIGIN if args.origin else "not asked for (origin: false)"
    for finding in [found["divergence"]] + [r["divergence"] for r in found["ranks"]]:
        if finding is not None:
            finding.update(origin=None, originReason=why)
    return found


def _against_reference(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """compareWithReference, referenceValue, readReference: asked of the rank _target names (its thread or frame),
    whose engine answers with the usual handler over its own float64 reference pass (FencedSession.forensics), the
    answer naming the rank (`rank`). Every rank's reference pass runs first, on all ranks at once, unless kept from
    before; before every rank has run its collectives it is refused (hardware/ranks/forensics.py)."""
    rank, arguments = _target(adapter, args)
    with working(adapter, "Running every rank's float64 reference pass"):
        adapter.session.reference_passes()
    body = {"rank": rank, **_ask(adapter, rank, handler.command, arguments)}
    if handler.command == "compareWithReference" and args.introduced:
        _judge_collectives(adapter, rank, body["rows"])
    return body


def _judge_collectives(adapter: "RequestContext", rank: int, rows: list[dict]) -> None:
    """A collective rerun on one rank's reference inputs measures nothing of its own (its result is made of every
    rank's input): its row's `introduced` is null, saying so, and beyond tolerance its verdict is firstDivergence's:
    `inherited` when a rank's input to it is beyond tolerance (`carriedBy` names them), else `introduced` (its own
    arithmetic: `carriedByReason`)."""
    carried = adapter.session.carried_into(rank)
    for row in rows:
        if row["node"] in carried:
            row.update(introduced=None, introducedReason=CARRIED)
            if not row["within"]:
                row.update(carried[row["node"]], verdict="inherited" if carried[row["node"]]["carriedBy"] else
                           "introduced")


def _collectives(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """Each rank's collectives, sends and recvs (the rank of `threadId`, else every rank): where it is, and each
    one with its process group's ranks, its partners, and whether it has run (Coordinator.schedule)."""
    adapter.require_launched()
    coordinator = adapter.session.coordinator
    ranks = [thread_unit(adapter, args.threadId)] if args.threadId is not None else range(coordinator.world_size)
    return {"ranks": [_schedule(coordinator.schedule(r)) for r in ranks]}


def _schedule(schedule: dict) -> dict:
    waits = schedule["waits"]
    return {"rank": schedule["rank"], "threadId": schedule["rank"] + 1, "tick": schedule["tick"],
            "passed": schedule["passed"], "waits": waits,
            **({"waitsReason": "it waits at no collective, send or recv"} if waits is None else {}),
            "collectives": [{**_collective(row["collective"]), "groupRanks": row["group"],
                             "partners": [_partner(q, m) for q, m in sorted(row["partners"], key=_ranked)],
                             "ran": row["ran"]}
                            for row in schedule["collectives"]]}


def _ranked(partner: tuple[int, int | None]) -> tuple[int, int]:
    return partner[0], -1 if partner[1] is None else partner[1]


def _partner(rank: int, index: int | None) -> dict:
    if index is None:
        return {"rank": rank, "number": None, "numberReason": f"rank {rank} has none to match it"}
    return {"rank": rank, "number": index + 1}


def _collective(c: Any) -> dict:
    return {"number": c.number, "tick": c.tick, "op": c.op, "description": c.describe(), "group": c.group,
            "tensors": list(c.tensors), "details": list(c.details), "source": c.where, "node": c.node,
            "value": c.value, "transfers": [{"direction": d, "peer": peer, "tag": tag, "tensor": spec}
                                            for d, peer, tag, spec in c.p2p]}


_SPECIAL: dict[str, Callable[["RequestContext", Any, "Handler"], Any]] = {
    "stackTrace": _stack_trace, "exceptionInfo": _exception_info,
    **dict.fromkeys(["scopes", "variables", "evaluate", "stepInTargets", "readMemory", "disassemble", "gotoTargets"],
                    _forward),
    **dict.fromkeys(["provenance", "locate", "writeHistory", "valueAt", "valueDiff", "histogram", "findTick",
                     "timeline", "checkpoints", "units", "listPatches"], _own),
    "timelineEvents": _timeline_events,
    **dict.fromkeys(["setBreakpoints", "setFunctionBreakpoints", "setExceptionBreakpoints"], _every_rank),
    **dict.fromkeys(["setDataBreakpoints", "setInstructionBreakpoints"], _each_on_its_rank),
    "dataBreakpointInfo": _data_breakpoint_info, "breakpointLocations": _lines_of_every_rank,
    **dict.fromkeys(["setVariable", "writeMemory"], _edit),
    **dict.fromkeys(["addPatch", "removePatch", "restoreBranch", "measureBranch", "compareBranches"], _no_patches),
    **dict.fromkeys(["continue", "reverseContinue", "next", "stepIn", "stepOut", "stepBack"], _every_thread),
    **dict.fromkeys(["source", "loadedSources"], _stopped_rank),
    "restart": _restart, "goto": _goto, "gotoStep": _goto_step, "restoreCheckpoint": _restore_checkpoint,
    "firstDivergence": _first_divergence, "collectives": _collectives,
    **dict.fromkeys(["compareWithReference", "referenceValue", "readReference"], _against_reference)}
