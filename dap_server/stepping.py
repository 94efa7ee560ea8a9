"""Moving through time: continue, next, stepIn (and stepInTargets), stepOut, stepBack, reverseContinue, goto, pause;
and Rewind's own gotoStep: to the start of a training step.

Direction is a parameter of the Session's primitives, so reverse is not a parallel code path:
`stepBack` is `next` with Direction.REVERSE. Each request answers at once; the motion runs on
the worker afterwards and ends in a `stopped` event.

Granularity, as DAP defines it: omitted is `statement`, which, like `line`, is a line of Python source;
`instruction` is one node (on a chip whose nodes run as instruction streams, one chip instruction, and
`stepInTargets` with `stepIn`'s `targetId` move node by node there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from dap_server.frames import check_thread, thread_unit
from dap_server.requests import Arguments, StrictArguments, capability, request
from dap_server.sources import SourceRef, source_path
from hardware.errors import RewindError
from hardware.session import Direction

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

FORWARD, REVERSE = Direction.FORWARD, Direction.REVERSE


class ContinueArguments(Arguments):
    threadId: int
    singleThread: bool = False


@request("continue")
@capability("supportsSingleThreadExecutionRequests")  # a rank alone (docs/ranks.md); one sim unit's instructions
def continue_(adapter: "RequestContext", args: ContinueArguments) -> dict:
    thread_unit(adapter, args.threadId)
    adapter.resume(lambda: adapter.session.run(FORWARD), "Continuing")
    return {"allThreadsContinued": True}


@request("reverseContinue")
def reverse_continue(adapter: "RequestContext", args: ContinueArguments) -> None:
    thread_unit(adapter, args.threadId)
    adapter.resume(lambda: adapter.session.run(REVERSE), "Reverse-continuing")


class StepArguments(Arguments):
    threadId: int
    singleThread: bool = False
    granularity: Literal["statement", "line", "instruction"] = "statement"  # omitted: statement, as DAP says


class StepInArguments(StepArguments):
    targetId: int | None = None  # an id from stepInTargets: run to the instant before that node of the line


def _step(adapter: "RequestContext", args: StepArguments, direction: Direction, kind: str, title: str) -> None:
    unit = thread_unit(adapter, args.threadId)  # a unit of a many-core chip steps its own instructions
    adapter.resume(lambda: adapter.session.step(direction, args.granularity, kind, unit, args.singleThread), title)


@request("next")
@capability("supportsSteppingGranularity")
def next_(adapter: "RequestContext", args: StepArguments) -> None:
    _step(adapter, args, FORWARD, "over", "Stepping")


@request("stepIn")
def step_in(adapter: "RequestContext", args: StepInArguments) -> None:
    if args.targetId is None:
        _step(adapter, args, FORWARD, "in", "Stepping in")
        return
    thread_unit(adapter, args.threadId)
    tick = args.targetId - 1
    if tick not in adapter.session.step_in_targets(None):  # the outermost frame's targets hold every frame's
        raise RewindError(f"stepIn: target {args.targetId} is not a node still to run on the current line "
                          "(stepInTargets lists them, anew after every motion)")
    adapter.resume(lambda: adapter.session.step_into(tick), "Stepping in")


class StepInTargetsArguments(Arguments):
    frameId: int


@request("stepInTargets")
@capability("supportsStepInTargetsRequest")
def step_in_targets(adapter: "RequestContext", args: StepInTargetsArguments) -> dict:
    """Each node still to run on the frame's line, in order (at most 1000): `stepIn` with a target's id runs to
    the instant before that node, so the first target is one node on, on any chip."""
    adapter.require_launched()
    level = adapter.frame_level(args.frameId)
    session = adapter.session
    ticks = session.step_in_targets(level)
    line = session.frames()[level].line
    entries = session.timeline_entries(ticks[0], len(ticks)) if ticks else []
    targets = []
    for entry in entries:
        target = {"id": entry["tick"] + 1, "label": _label(entry)}
        if line:
            target["line"] = adapter.client_line(line)
        targets.append(target)
    return {"targets": targets}


@request("stepOut")
def step_out(adapter: "RequestContext", args: StepArguments) -> None:
    _step(adapter, args, FORWARD, "out", "Stepping out")


@request("stepBack")
@capability("supportsStepBack")
def step_back(adapter: "RequestContext", args: StepArguments) -> None:
    _step(adapter, args, REVERSE, "over", "Stepping back")


class PauseArguments(Arguments):
    threadId: int


@request("pause", on_loop=True)
def pause(adapter: "RequestContext", args: PauseArguments) -> None:
    """Answered on the event loop while a motion runs on the worker; the motion stops with reason pause."""
    adapter.pause()


class GotoTargetsArguments(Arguments):
    source: SourceRef
    line: int
    column: int | None = None
    threadId: int | None = None  # Rewind's: with ranks the rank whose ticks (docs/ranks.md); else only checked


@request("gotoTargets")
@capability("supportsGotoTargetsRequest")
def goto_targets(adapter: "RequestContext", args: GotoTargetsArguments) -> dict:
    """Every tick where the line's execution begins (a line in a loop of layers runs once per layer)."""
    check_thread(adapter, args.threadId)
    session = adapter.session
    line, ticks = session.line_positions(source_path(args.source), adapter.engine_line(args.line))
    targets = []
    for tick in ticks:
        entry = session.timeline_entries(tick, 1)[0]
        targets.append({"id": tick + 1, "label": _label(entry), "line": adapter.client_line(line)})
    return {"targets": targets}


def _label(entry: dict) -> str:
    """A tick as a target's label: `tick 43: ones_1 (aten.ones.default) in blocks.1.attn`."""
    where = f" in {entry['module']}" if entry["module"] else ""
    return f"tick {entry['tick']}: {entry['node']} ({entry['op']}){where}"


class GotoArguments(Arguments):
    threadId: int
    targetId: int


@request("goto")
def goto(adapter: "RequestContext", args: GotoArguments) -> None:
    thread_unit(adapter, args.threadId)
    tick, end = args.targetId - 1, adapter.session.end
    if not 0 <= tick <= end:
        raise RewindError(f"goto target {args.targetId} is not a tick of the program (targets are 1..{end + 1})")
    adapter.resume(lambda: adapter.session.goto(tick), f"Going to tick {tick}")


class GotoStepArguments(StrictArguments):
    step: int  # a training step, from 0
    threadId: int = 1


@request("gotoStep")
def goto_step(adapter: "RequestContext", args: GotoStepArguments) -> None:
    """Rewind's own: to the start of a training step, before its first node runs (a step it does not have is an
    error answered at once)."""
    thread_unit(adapter, args.threadId)
    adapter.session.step_start(args.step)
    adapter.resume(lambda: adapter.session.goto_step(args.step), f"Going to step {args.step}")
