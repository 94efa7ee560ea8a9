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
from hardware import events as domain
from hardware.events import PROGRESS_DELAY_S, SessionEvent

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

MAIN_THREAD = 1  # DAP thread id of unit 0; unit i is thread i + 1
OUTPUT_CATEGORIES = {"important": "important", "log": "console", "error": "stderr", "stdout": "stdout"}


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

    def __init__(self, adapter: "RequestContext"):
        self.adapter = adapter
        self.current: Progress | None = None
        self._progress_numbers = itertools.count(1)  # this session's own: ids start at 1 in every session

    def __call__(self, event: SessionEvent) -> None:
        emit = self.adapter.emit
        if isinstance(event, domain.Stopped):
            self.end_progress()
            emit("stopped", self._stopped(event))
        elif isinstance(event, domain.Output):
            emit("output", {"category": OUTPUT_CATEGORIES[event.level], "output": event.text})
        elif isinstance(event, domain.Progress):
            if self.current is not None:
                self.current.update(event.message, event.percentage)
        elif isinstance(event, domain.Invalidated):
            self.invalidate(*(["variables"] if event.values else []) + (["stacks"] if event.frames else []))
        elif isinstance(event, domain.RecordingStarted):  # for the front: it keeps the recording if this engine dies
            self.adapter.notify("recording", {"partial": event.partial, "target": event.target,
                                              "overwrite": event.overwrite})
        # Nondeterminism arrives together with an Output that says it in words.

    def invalidate(self, *areas: str) -> None:
        if self.adapter.client.invalidated:
            self.adapter.emit("invalidated", {"areas": list(areas)})

    def _stopped(self, event: domain.Stopped) -> dict:
        unit = event.unit  # the unit a stop on a many-core chip is about (a race's second access)
        out: dict[str, Any] = {"reason": event.reason, "threadId": MAIN_THREAD if unit is None else unit + 1,
                               "allThreadsStopped": True}
        if event.description:
            out["description"] = event.description
        if event.breakpoint_ids:
            out["hitBreakpointIds"] = list(event.breakpoint_ids)
        stop = self.adapter.session.last_stop
        if event.reason == "exception" and stop is not None and stop.exception is not None:
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
def working(adapter: "RequestContext", title: str) -> Iterator[None]:
    """A long custom request: progress shown at once (not after the usual half second)."""
    adapter.require_launched()
    with adapter.events.progress(title, cancellable=False) as progress:
        if progress is not None:
            progress.update(f"{title}: starting", 0.0)
        yield
