"""Rewind's own requests (documented in docs/protocol.md): checkpoints, restoreCheckpoint, collectives, locate,
provenance, timeline, timelineEvents. Their arguments are strict: an unknown field is an error naming it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from dap_server.events import working
from dap_server.frames import check_thread
from dap_server.requests import StrictArguments, request
from hardware.errors import RewindError
from provenance.births import births

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

MAX_TIMELINE_TICKS = 10_000


class CheckpointsArguments(StrictArguments):
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("checkpoints")
def checkpoints(adapter: "RequestContext", args: CheckpointsArguments) -> dict:
    check_thread(adapter, args.threadId)
    return {"checkpoints": adapter.session.checkpoints()}


class RestoreCheckpointArguments(StrictArguments):
    tick: int
    threadId: int | None = None  # with ranks: the rank whose checkpoint (docs/ranks.md, "Many ranks"); else checked


@request("restoreCheckpoint")
def restore_checkpoint(adapter: "RequestContext", args: RestoreCheckpointArguments) -> None:
    check_thread(adapter, args.threadId)
    ticks = [c["tick"] for c in adapter.session.checkpoints()]
    if args.tick not in ticks:
        raise RewindError(f"no checkpoint at tick {args.tick}; checkpoints: {ticks}")
    adapter.resume(lambda: adapter.session.restore(args.tick), f"Restoring the checkpoint at tick {args.tick}")


class CollectivesArguments(StrictArguments):
    threadId: int | None = None  # with ranks: the rank asked; none: every rank


@request("collectives")
def collectives(adapter: "RequestContext", args: CollectivesArguments) -> dict:
    """A session of many ranks answers it (dap_server/ranks.py); one process runs no collective."""
    check_thread(adapter, args.threadId)
    raise RewindError("'collectives' lists the collectives, sends and recvs of a session of many ranks: this "
                      "session runs one process (launch with ranks)")


class ValueArguments(StrictArguments):
    name: str  # a source variable (`scores`) or a Program value (`div`)
    frameId: int | None = None


@request("locate")
def locate(adapter: "RequestContext", args: ValueArguments) -> dict:
    """A value's Placement; in a kernel's session a tensor of the kernel, or one element of it by flat index
    (`out_ptr[37]`), is answered by the session with what the programs did to it (`kernel`, docs/kernels.md)."""
    level = adapter.frame_level(args.frameId)
    adapter.require_launched()
    found = adapter.session.locate_elements(args.name)
    if found is not None:
        return found
    return adapter.session.locate(adapter.resolve_value(args.name, level)).to_dict()


class ProvenanceArguments(ValueArguments):
    maxHistory: int = Field(64, ge=0, le=4096)


@request("provenance")
def provenance(adapter: "RequestContext", args: ProvenanceArguments) -> dict:
    value = adapter.resolve_value(args.name, adapter.frame_level(args.frameId))
    return adapter.session.provenance(value, max_history=args.maxHistory)


class TimelineArguments(StrictArguments):
    start: int | None = None  # default: the current position
    count: int = Field(100, ge=0, le=MAX_TIMELINE_TICKS)
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("timeline")
def timeline(adapter: "RequestContext", args: TimelineArguments) -> dict:
    check_thread(adapter, args.threadId)
    session = adapter.session
    start = session.position if args.start is None else args.start
    return {"position": session.position, "end": session.end, "ticks": session.timeline_entries(start, args.count),
            "steps": session.steps()}


class TimelineEventsArguments(StrictArguments):
    start: int = Field(0, ge=0)  # first tick
    count: int | None = Field(None, ge=0)  # ticks (default: to the end)
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("timelineEvents")
def timeline_events(adapter: "RequestContext", args: TimelineEventsArguments) -> dict:
    """What happens where, merged by tick: the stops breakpoints make, the births of NaN/Inf (a write of non-finite
    values its inputs did not carry), the checkpoints. The pass is run to its end first."""
    check_thread(adapter, args.threadId)
    with working(adapter, "Listing the timeline's events"):
        session = adapter.session
        stop = session.end + 1 if args.count is None else args.start + args.count
        events = [{"event": "checkpoint", **c} for c in session.checkpoints() if args.start <= c["tick"] < stop]
        events += [{"event": "stop", "tick": s.tick, "reason": s.reason, "description": s.description,
                    "breakpoints": list(s.breakpoint_ids)} for s in session.breakpoint_stops(args.start, stop)]
        events += [{"event": "birth", **b.to_dict()} for b in births(session.tl, session.program)
                   if args.start <= b.tick < stop]
    return {"position": session.position, "end": session.end, "start": args.start, "stop": min(stop, session.end + 1),
            "events": sorted(events, key=lambda e: e["tick"])}
