"""Rewind's own requests (documented in docs/protocol.md): checkpoints, restoreCheckpoint, locate,
provenance, timeline. Their arguments are strict: an unknown field is an error naming it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from dap_server.requests import StrictArguments, request
from hardware.errors import RewindError

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

MAX_TIMELINE_TICKS = 10_000


class CheckpointsArguments(StrictArguments):
    pass


@request("checkpoints")
def checkpoints(adapter: "RequestContext", args: CheckpointsArguments) -> dict:
    adapter.require_launched()
    return {"checkpoints": adapter.session.checkpoints()}


class RestoreCheckpointArguments(StrictArguments):
    tick: int


@request("restoreCheckpoint")
def restore_checkpoint(adapter: "RequestContext", args: RestoreCheckpointArguments) -> None:
    adapter.require_launched()
    ticks = [c["tick"] for c in adapter.session.checkpoints()]
    if args.tick not in ticks:
        raise RewindError(f"no checkpoint at tick {args.tick}; checkpoints: {ticks}")
    adapter.resume(lambda: adapter.session.restore(args.tick), f"Restoring the checkpoint at tick {args.tick}")


class ValueArguments(StrictArguments):
    name: str  # a source variable (`scores`) or a Program value (`div`)
    frameId: int | None = None


@request("locate")
def locate(adapter: "RequestContext", args: ValueArguments) -> dict:
    value = adapter.resolve_value(args.name, adapter.frame_level(args.frameId))
    return adapter.session.locate(value).to_dict()


class ProvenanceArguments(ValueArguments):
    maxHistory: int = Field(64, ge=0, le=4096)


@request("provenance")
def provenance(adapter: "RequestContext", args: ProvenanceArguments) -> dict:
    value = adapter.resolve_value(args.name, adapter.frame_level(args.frameId))
    return adapter.session.provenance(value, max_history=args.maxHistory)


class TimelineArguments(StrictArguments):
    start: int | None = None  # default: the current position
    count: int = Field(100, ge=0, le=MAX_TIMELINE_TICKS)


@request("timeline")
def timeline(adapter: "RequestContext", args: TimelineArguments) -> dict:
    adapter.require_launched()
    session = adapter.session
    start = session.position if args.start is None else args.start
    return {"position": session.position, "end": session.end, "ticks": session.timeline_entries(start, args.count)}
