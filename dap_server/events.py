"""Session events become DAP events: stopped, output, progress, invalidated.

The Session reports what happens in its own vocabulary (on its worker thread); this is the one
place that turns that into DAP. Progress is reported only for work that has already run half
a second, and only to clients that said `supportsProgressReporting`.
"""

from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from dap_server.breakpoints import EXCEPTION_KINDS
from hardware.session import SessionEvent

if TYPE_CHECKING:
    from dap_server.adapter import Adapter

MAIN_THREAD = 1  # DAP thread id of unit 0; unit i is thread i + 1
PROGRESS_DELAY_S = 0.5


class Progress:
    """progressStart/Update/End for one piece of work; starts once the work has run PROGRESS_DELAY_S."""

    def __init__(self, emit: Callable[[str, dict], None], title: str, cancellable: bool, number: int):
        self.id = f"rewind-progress-{number}"  # `number`: the session's count of its progress reports
        self.cancellable = cancellable
        self._emit, self._title = emit, title
        self._lock = threading.Lock()
        self._started = self._ended = False
        self._timer = threading.Timer(PROGRESS_DELAY_S, self._start)
        self._timer.daemon = True
        self._timer.start()

    def _start(self) -> None:
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if not self._started and not self._ended:
            self._started = True
            self._emit("progressStart", {"progressId": self.id, "title": self._title,
                                         "cancellable": self.cancellable})

    def update(self, message: str, percentage: float | None) -> None:
        with self._lock:
            if self._ended:
                return
            self._start_locked()
            body: dict[str, Any] = {"progressId": self.id, "message": message}
            if percentage is not None:
                body["percentage"] = max(0.0, min(100.0, float(percentage)))
            self._emit("progressUpdate", body)

    def end(self) -> None:
        with self._lock:
            self._timer.cancel()
            if self._started and not self._ended:
                self._emit("progressEnd", {"progressId": self.id})
            self._ended = True


class SessionEvents:
    """The Session's `on_event`: translates each domain event for the adapter's client."""

    def __init__(self, adapter: "Adapter"):
        self.adapter = adapter
        self.current: Progress | None = None
        self._progress_numbers = itertools.count(1)  # this session's own: ids start at 1 in every session

    def __call__(self, event: SessionEvent) -> None:
        body, emit = event.body, self.adapter.emit
        if event.kind == "stopped":
            self.end_progress()
            emit("stopped", self._stopped(body))
        elif event.kind == "output":
            emit("output", {"category": body.get("category", "console"), "output": body["text"]})
        elif event.kind == "progress":
            if self.current is not None:
                self.current.update(body["message"], body.get("percentage"))
        elif event.kind == "invalidated":
            self.invalidate(*body["areas"])
        elif event.kind == "recording":  # for the front: it keeps the recording if this engine dies
            self.adapter.notify("recording", body)
        # "nondeterminism" arrives together with an output event that says it in words.

    def invalidate(self, *areas: str) -> None:
        if self.adapter.client.invalidated:
            self.adapter.emit("invalidated", {"areas": list(areas)})

    def _stopped(self, body: dict) -> dict:
        unit = body.get("unit")  # the unit a stop on a many-core chip is about (a race's second access)
        out: dict[str, Any] = {"reason": body["reason"], "threadId": MAIN_THREAD if unit is None else unit + 1,
                               "allThreadsStopped": True}
        if body.get("description"):
            out["description"] = body["description"]
        if body.get("hitBreakpointIds"):
            out["hitBreakpointIds"] = list(body["hitBreakpointIds"])
        stop = self.adapter.session.last_stop
        if body["reason"] == "exception" and stop is not None and stop.exception is not None:
            out["text"] = EXCEPTION_KINDS[stop.exception.filter]
        return out

    @contextmanager
    def progress(self, title: str, cancellable: bool) -> Iterator[Progress | None]:
        """Report `title` as progress while the block runs (when the client wants progress at all)."""
        if not self.adapter.client.progress:
            yield None
            return
        self.current = Progress(self.adapter.emit, title, cancellable, next(self._progress_numbers))
        try:
            yield self.current
        finally:
            self.end_progress()

    def end_progress(self) -> None:
        if self.current is not None:
            self.current.end()
            self.current = None


@contextmanager
def working(adapter: "Adapter", title: str) -> Iterator[None]:
    """A long custom request: progress shown at once (not after the usual half second)."""
    adapter.require_launched()
    with adapter.events.progress(title, cancellable=False) as progress:
        if progress is not None:
            progress.update(f"{title}: starting", 0.0)
        yield
