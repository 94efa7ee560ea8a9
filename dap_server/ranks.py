"""A session of many ranks through DAP (docs/ranks.md; docs/protocol.md, "Many ranks"): each rank is a thread.

With `ranks` in the launch the adapter's session is a RankedSession (hardware/ranks/session.py). Motions, threads
and the lifecycle are the usual handlers over it: every rank moves, through consistent cuts. A request about one
rank's values is forwarded to that rank's engine, which answers it with the usual handler over its own Session
(dap_server/engine.py's RankAdapterEngine); its ids are made the session's own here: a frame id carries its
thread (rank + 1) as on any chip (frames.FRAMES_PER_THREAD), a variable reference is the adapter's and names the
rank's own. A request the ranks cannot answer yet is refused in words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from dap_server.events import working
from dap_server.frames import FRAMES_PER_THREAD, thread_unit
from hardware.errors import RewindError
from hardware.ticks import Direction

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it
    from dap_server.requests import Arguments, Handler

Answer = Callable[["RequestContext", "Arguments"], Any]

# Answered by the usual handler over the RankedSession.
USUAL = {"initialize", "launch", "attach", "configurationDone", "restart", "disconnect", "terminate", "cancel",
         "pause", "threads"}


@dataclass(frozen=True)
class RankReference:
    """A rank's own variablesReference, behind one of the adapter's."""

    rank: int
    ref: int


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
def _ask(adapter: "RequestContext", rank: int, command: str, arguments: dict) -> dict:
    message = {"op": "dap", "command": command, "arguments": arguments}
    return _ours(adapter, rank, adapter.session.ask(rank, message, f"answering {command}"))


def _ours(adapter: "RequestContext", rank: int, body: Any) -> Any:
    """A rank's answer with its variable references made the adapter's; memory references, which name the rank's
    own memory (readMemory is not supported with ranks yet), left out."""
    if isinstance(body, list):
        return [_ours(adapter, rank, item) for item in body]
    if not isinstance(body, dict):
        return body
    out = {}
    for key, value in body.items():
        if key == "variablesReference" and isinstance(value, int) and value > 0:
            out[key] = adapter.variables.add(RankReference(rank, value))
        elif key != "memoryReference":
            out[key] = _ours(adapter, rank, value)
    return out


def _frame_rank(adapter: "RequestContext", frame_id: int | None) -> tuple[int, int | None]:
    """The rank a frame id is of, and the rank's own id for it; no frame: the rank the last stop is about."""
    if frame_id is None:
        stop = adapter.session.last_stop
        return (stop.unit or 0) if stop is not None else 0, None
    rank, level = divmod(frame_id - 1, FRAMES_PER_THREAD)
    if frame_id < 1 or rank >= len(adapter.session.units()):
        raise RewindError(f"no frame {frame_id}: frames of thread t (rank t - 1) have ids from "
                          f"(t - 1) * {FRAMES_PER_THREAD} + 1")
    return rank, level + 1


def _stack_trace(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    rank = thread_unit(adapter, args.threadId)
    body = _ask(adapter, rank, "stackTrace", {**args.model_dump(exclude_unset=True), "threadId": 1})
    for frame in body["stackFrames"]:
        frame["id"] += rank * FRAMES_PER_THREAD
    return body


def _by_frame(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """scopes, evaluate: asked of the frame's rank (evaluate without a frame: of the rank the stop is about)."""
    rank, frame = _frame_rank(adapter, args.frameId)
    arguments = args.model_dump(exclude_unset=True)
    if frame is not None:
        arguments["frameId"] = frame
    return _ask(adapter, rank, handler.command, arguments)


def _variables(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    theirs = adapter.variables.get(args.variablesReference)
    return _ask(adapter, theirs.rank, "variables", {**args.model_dump(exclude_unset=True),
                                                    "variablesReference": theirs.ref})


def _every_rank(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """setBreakpoints, setExceptionBreakpoints: on every rank, each binding them to its own Program; a breakpoint is
    verified where any rank could bind it (its id and line are the first such rank's)."""
    adapter.require_launched()
    message = {"op": "dap", "command": handler.command, "arguments": args.model_dump(exclude_unset=True)}
    answers = adapter.session.ask_all(message, f"answering {handler.command}")
    lists = [answers[r]["breakpoints"] for r in sorted(answers)]
    merged = [next((bp for bp in same if bp.get("verified")), same[0]) for same in zip(*lists)]
    return {"breakpoints": merged}


def _exception_info(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """The coordinator's own finding (a mismatch, a rank that did not answer, replicas that differ) and a NaN/Inf
    traced across ranks (hardware/ranks/numerics.py) here; any other exception of a rank's own from that rank."""
    stop = adapter.session.last_stop
    if stop is not None and stop.exception is not None:
        return handler.fn(adapter, args)
    rank = thread_unit(adapter, args.threadId)
    return _ask(adapter, rank, "exceptionInfo", {"threadId": 1})


def _every_thread(adapter: "RequestContext", args: Any, handler: "Handler") -> Any:
    """continue, next, stepIn, stepOut and their reverse: the usual handlers, every rank moving; with singleThread,
    the thread's rank alone (_one_rank)."""
    if getattr(args, "targetId", None) is not None:
        raise RewindError("stepIn targets are not supported with ranks yet: step in without a target")
    if args.singleThread:
        return _one_rank(adapter, args, handler)
    return handler.fn(adapter, args)


_ALONE = {"continue": (Direction.FORWARD, None), "reverseContinue": (Direction.REVERSE, None),
          "next": (Direction.FORWARD, "over"), "stepIn": (Direction.FORWARD, "in"),
          "stepOut": (Direction.FORWARD, "out"), "stepBack": (Direction.REVERSE, "over")}


def _one_rank(adapter: "RequestContext", args: Any, handler: "Handler") -> dict | None:
    """The thread's rank alone moves, the others staying where they are: forward up to its next collective at most,
    back to right after its last; a rank waiting at one stays, and its stop says why (docs/ranks.md)."""
    rank = thread_unit(adapter, args.threadId)
    direction, kind = _ALONE[handler.command]
    session = adapter.session
    if kind is None:
        adapter.resume(lambda: session.run(direction, rank, single_thread=True), f"Continuing rank {rank} alone")
        return {"allThreadsContinued": False} if handler.command == "continue" else None
    adapter.resume(lambda: session.step(direction, args.granularity, kind, rank, single_thread=True),
                   f"Stepping rank {rank} alone")
    return None


def _stopped_rank(adapter: "RequestContext", args: Any, handler: "Handler") -> dict:
    """gotoTargets, timeline, source, loadedSources: asked of the rank the last stop is about (a goto then moves
    its thread's rank)."""
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


_SPECIAL: dict[str, Callable[["RequestContext", Any, "Handler"], Any]] = {
    "stackTrace": _stack_trace, "scopes": _by_frame, "evaluate": _by_frame, "variables": _variables,
    "setBreakpoints": _every_rank, "setExceptionBreakpoints": _every_rank, "exceptionInfo": _exception_info,
    "continue": _every_thread, "reverseContinue": _every_thread, "next": _every_thread, "stepIn": _every_thread,
    "stepOut": _every_thread, "stepBack": _every_thread, "gotoTargets": _stopped_rank, "timeline": _stopped_rank,
    "source": _stopped_rank, "loadedSources": _stopped_rank, "goto": _goto, "firstDivergence": _first_divergence}
