"""threads and stackTrace: a DAP thread is a Unit; frames are the node at its line, then module forwards."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dap_server.requests import Arguments, capability, request
from hardware.errors import RewindError

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it
    from hardware.session import FrameInfo


FRAMES_PER_THREAD = 10_000  # frame ids of thread t are (t - 1) * FRAMES_PER_THREAD + level + 1


def thread_unit(adapter: "RequestContext", thread_id: int) -> int:
    """The unit a DAP thread id names (ids are 1..units), or a clear error."""
    adapter.require_launched()
    count = len(adapter.session.units())
    if not 1 <= thread_id <= count:
        raise RewindError(f"no thread {thread_id}: this program's threads are 1..{count}")
    return thread_id - 1


def check_thread(adapter: "RequestContext", thread_id: int | None) -> None:
    """A request about ticks that may name a thread (Rewind's own): with ranks, each rank has ticks of its own and
    the thread names the rank (dap_server/ranks.py); one process's threads share its one timeline, so the thread is
    only checked."""
    adapter.require_launched()
    if thread_id is not None:
        thread_unit(adapter, thread_id)


class ThreadsArguments(Arguments):
    pass


@request("threads", on_loop=True)
def threads(adapter: "RequestContext", args: ThreadsArguments) -> dict:
    """Answered on the event loop: the unit list is fixed at launch, so it never waits for a motion."""
    units = adapter.session.units() if adapter.loaded else []
    return {"threads": [{"id": i + 1, "name": name} for i, name in enumerate(units)]}


class StackTraceArguments(Arguments):
    threadId: int
    startFrame: int = 0
    levels: int = 0
    format: dict | None = None


@request("stackTrace")
@capability("supportsDelayedStackTraceLoading")
def stack_trace(adapter: "RequestContext", args: StackTraceArguments) -> dict:
    unit = thread_unit(adapter, args.threadId)
    if args.startFrame < 0 or args.levels < 0:
        raise RewindError(f"stackTrace: startFrame ({args.startFrame}) and levels ({args.levels}) cannot be negative")
    frames = adapter.session.frames(unit=unit)  # a unit's stack starts at its next instruction
    chosen = frames[args.startFrame:]
    if args.levels > 0:
        chosen = chosen[: args.levels]
    return {"stackFrames": [_frame(adapter, f, args.threadId) for f in chosen], "totalFrames": len(frames)}


def _frame(adapter: "RequestContext", frame: "FrameInfo", thread: int = 1) -> dict:
    """Frame ids are unique across threads: (thread - 1) * FRAMES_PER_THREAD + level + 1 (adapter.frame_level)."""
    out = {"id": (thread - 1) * FRAMES_PER_THREAD + frame.id + 1, "name": frame.name,
           "line": adapter.client_line(frame.line), "column": adapter.client_column(1) if frame.line else 0}
    if frame.instruction_pointer is not None:
        out["instructionPointerReference"] = f"{frame.instruction_pointer:#x}"
    if frame.file:
        out["source"] = source(frame.file)
    else:
        out["presentationHint"] = "label"  # a user edit: a step with no source line
    return out


def source(path: str) -> dict:
    return {"name": Path(path).name, "path": path}
