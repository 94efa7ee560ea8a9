"""One client's debugging session: the Session, the one worker thread that owns it, the client's handles.

Every Session call runs on `worker`, a single thread, so the Session never has two callers and
the event loop stays free to answer pause, cancel and threads while a motion runs there.
A motion (continue, step, goto, ...) is handed to the worker only after its request has been
answered, so the client always sees the response before the `stopped` event.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from dap_server import ranks
from dap_server.breakpoints import DEFAULT_EXCEPTION_FILTERS
from dap_server.events import MAIN_THREAD, SessionEvents
from dap_server.failures import Cancelled, describe_failure
from dap_server.frames import FRAMES_PER_THREAD
from dap_server.variables import VariableTable
from hardware.errors import NotStoppedError, RewindError
from hardware.ranks.session import RankedSession
from hardware.session import Session

if TYPE_CHECKING:
    from dap_server.requests import Arguments, Handler

log = logging.getLogger(__name__)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class ClientCapabilities:
    """What the client said about itself in `initialize`."""

    progress: bool = False
    invalidated: bool = False
    memory_event: bool = False
    lines_start_at_1: bool = True
    columns_start_at_1: bool = True


@dataclass
class Motion:
    run: Callable[[], Any]
    title: str


class Adapter:
    def __init__(self, emit: Callable[[str, dict | None], None],
                 notify: Callable[[str, dict], None] = lambda kind, body: None, session_kind: type[Session] = Session):
        """`session_kind`: the Session of one process (a rank's engine has one of its own: hardware/ranks/worker.py)."""
        self.emit = emit  # thread-safe: queue an event for the client
        self.notify = notify  # thread-safe: tell the front something that is not for the client (a recording's file)
        self.client = ClientCapabilities()
        self.events = SessionEvents(self)
        self._session_kind = session_kind
        self.session: Session | RankedSession = self._one_process()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewind-session")
        self.variables = VariableTable()
        self.launched = False
        self.cwd: str | None = None  # the working directory the last launch gave (dap_server/paths.py)
        self.closing = False  # the connection ends once the current response is sent
        self.terminated = False
        self._motion: Motion | None = None  # set by a handler, started after its response
        self._motions_pending = 0  # queued or running motions (pause only means something then)
        self._motion_seq: int | None = None  # the request whose motion runs
        self._running_seq: int | None = None  # the request the worker runs now
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()

    # -- the hand-off to the worker -------------------------------------------------------------
    async def call(self, seq: int, handler: "Handler", args: "Arguments") -> tuple[Any, Motion | None]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.worker, self._call, seq, handler, args)

    def _call(self, seq: int, handler: "Handler", args: "Arguments") -> tuple[Any, Motion | None]:
        with self._lock:
            if seq in self._cancelled:
                self._cancelled.discard(seq)
                raise Cancelled("cancelled")
        self._motion = None
        self._running_seq = seq
        answer = ranks.answer_for(handler) if isinstance(self.session, RankedSession) else handler.fn
        try:
            body = answer(self, args)
        finally:
            self._running_seq = None
        motion, self._motion = self._motion, None
        return body, motion

    def resume(self, run: Callable[[], Any], title: str) -> None:
        """Called by a handler: after the response, run `run` (which ends in a stop) on the worker."""
        self.require_launched()
        self._motion = Motion(run, title)

    def start_motion(self, seq: int, motion: Motion) -> None:
        with self._lock:
            self._motions_pending += 1
        try:
            self.worker.submit(self._run_motion, seq, motion)
        except RuntimeError:  # the worker is shut down: the connection is closing
            with self._lock:
                self._motions_pending -= 1

    def _run_motion(self, seq: int, motion: Motion) -> None:
        self.variables.clear()  # references live for one stop
        self._motion_seq = seq
        try:
            with self.events.progress(motion.title, cancellable=True):
                motion.run()
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # the client believes the program moves:
            # it must hear that it stopped, even when the program's own code (a patch) asked to exit
            text = describe_failure(motion.title.lower(), exc)
            self.emit("output", {"category": "stderr", "output": f"{motion.title} failed: {text}\n"})
            self.emit("stopped", {"reason": "exception", "description": text, "threadId": MAIN_THREAD,
                                  "allThreadsStopped": True, "text": "the motion failed"})
        finally:
            self._motion_seq = None
            with self._lock:
                self._motions_pending -= 1

    def pause(self) -> None:
        """Thread-safe: stop the motion that runs or is about to, and the evaluation that runs now."""
        with self._lock:
            if self._motions_pending:
                self.session.pause()
        self.session.interrupt()  # only an evaluation running now hears it (each one starts with it cleared)

    def cancel(self, request_id: int | None, progress_id: str | None) -> None:
        progress = self.events.current
        if progress_id is not None and progress is not None and progress.id == progress_id and progress.cancellable:
            self.pause()
        if request_id is not None:
            if request_id == self._motion_seq:
                self.pause()
                return
            if request_id == self._running_seq:  # it runs now: its evaluation stops
                self.session.interrupt()
                return
            with self._lock:
                self._cancelled.add(request_id)  # answered `cancelled` when its turn comes, if it is queued

    def close(self) -> None:
        """The client is gone: stop what runs, end the Session on its worker, let the worker go."""
        self.pause()
        try:
            self.worker.submit(self.session.close)
        except RuntimeError:
            pass
        self.worker.shutdown(wait=False, cancel_futures=False)

    # -- the session ------------------------------------------------------------------------------------
    def _one_process(self) -> Session:
        session = self._session_kind(on_event=self.events)
        session.set_exception_filters(DEFAULT_EXCEPTION_FILTERS)  # until the client chooses its own
        return session

    def use_ranks(self, count: int | None, timeout_s: float) -> None:
        """Before a (re)launch: a launch with ranks is driven by a RankedSession, whose ranks are engine processes
        of this module's kind (a rank silent for `timeout_s` is reported); one without, by a Session. The session
        that was is closed when the kind changes."""
        if (count is not None) != isinstance(self.session, RankedSession):
            self.session.close()
            hello = {"op": "hello", "linesStartAt1": self.client.lines_start_at_1,
                     "columnsStartAt1": self.client.columns_start_at_1}
            self.session = (RankedSession(self.events, "dap_server.engine", hello) if count is not None
                            else self._one_process())
        if isinstance(self.session, RankedSession):
            self.session.timeout_s = timeout_s

    # -- helpers for handlers ----------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        """A program is loaded (a relaunch that failed after the last one closed leaves none)."""
        if isinstance(self.session, RankedSession):
            return self.launched and self.session.loaded
        return self.launched and self.session.timeline is not None

    def require_launched(self) -> None:
        if not self.loaded:
            raise NotStoppedError("no program is loaded: send 'launch' first")

    def frame_level(self, frame_id: int | None) -> int:
        """Frame ids are level + 1 (0 is the innermost frame: the node at its source line), offset per thread by
        frames.FRAMES_PER_THREAD: every unit's stack has the same levels."""
        if frame_id is None:
            return 0
        depth = len(self.session.frames())
        level = (frame_id - 1) % FRAMES_PER_THREAD if frame_id >= 1 else -1
        if not 0 <= level < depth:
            base = max(frame_id - 1, 0) // FRAMES_PER_THREAD * FRAMES_PER_THREAD  # its thread's first frame id, less 1
            raise RewindError(f"no frame {frame_id}: the stack has {depth} frame(s) (ids {base + 1}..{base + depth})")
        return level

    def resolve_value(self, name: str, level: int = 0) -> str:
        """A Program value name from what the user typed: a source variable (`scores`) or a value (`div`)."""
        self.require_launched()
        name = name.strip()
        value = self.session.resolve_name(name, level)  # a variable of another frame, or unassigned: said here
        if value is not None:
            return value
        aliases = self.session.source_names(level=level)
        hint = f"; source variables here: {', '.join(sorted(aliases))}" if aliases else ""
        what = "variable or value" if _IDENTIFIER.match(name) else "value name (an expression is not a value)"
        raise RewindError(f"'{name}' is not a {what} of the program{hint}")

    def client_line(self, line: int | None) -> int:
        if line is None:
            return 0
        return line if self.client.lines_start_at_1 else line - 1

    def engine_line(self, line: int) -> int:
        return line if self.client.lines_start_at_1 else line + 1

    def client_column(self, column: int) -> int:
        return column if self.client.columns_start_at_1 else column - 1
