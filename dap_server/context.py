"""What a request handler is handed: the adapter, as far as the handlers use it.

dap_server/adapter.py builds the Adapter (the Session, its worker, the client's handles) and
imports the request modules to register their handlers; the request modules type the adapter
they are called with against `RequestContext`, so they never import dap_server/adapter.py back.
`Adapter` satisfies these Protocols structurally.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Protocol

from hardware.session import Session


class ClientView(Protocol):
    """What the client said about itself in `initialize` (the initialize handler fills it in)."""

    progress: bool
    invalidated: bool
    memory_event: bool
    lines_start_at_1: bool
    columns_start_at_1: bool


class ProgressView(Protocol):
    """One piece of work reported as DAP progress (dap_server/events.py's Progress)."""

    def update(self, message: str, percentage: float | None) -> None: ...


class EventsView(Protocol):
    """The Session's events as the client hears them (dap_server/events.py's SessionEvents)."""

    def progress(self, title: str, cancellable: bool) -> AbstractContextManager[ProgressView | None]: ...
    def invalidate(self, *areas: str) -> None: ...


class VariableStore(Protocol):
    """variablesReference -> container, for one stop (dap_server/variables.py's VariableTable)."""

    def add(self, container: Any) -> int: ...
    def get(self, ref: int) -> Any: ...
    def clear(self) -> None: ...


class RequestContext(Protocol):
    """One client's debugging session, as a request handler uses it."""

    launched: bool  # a program was launched (set by launch and attach)
    closing: bool  # the connection ends once the current response is sent (set by disconnect)
    terminated: bool  # the client was told the debuggee terminated
    cwd: str | None  # the working directory the last launch gave; relative paths resolve against it

    @property
    def session(self) -> Session: ...
    @property
    def client(self) -> ClientView: ...
    @property
    def events(self) -> EventsView: ...
    @property
    def variables(self) -> VariableStore: ...
    @property
    def emit(self) -> Callable[[str, dict | None], None]: ...  # thread-safe: queue an event for the client
    @property
    def notify(self) -> Callable[[str, dict], None]: ...  # thread-safe: tell the front (not the client)
    @property
    def loaded(self) -> bool: ...  # a program is loaded

    def require_launched(self) -> None: ...
    def use_ranks(self, count: int | None, timeout_s: float) -> None: ...  # before a launch: a session of its kind
    def resume(self, run: Callable[[], Any], title: str) -> None: ...  # run `run` on the worker after the response
    def pause(self) -> None: ...
    def cancel(self, request_id: int | None, progress_id: str | None) -> None: ...

    # the client's frames, names and lines
    def frame_level(self, frame_id: int | None) -> int: ...
    def resolve_value(self, name: str, level: int = 0) -> str: ...
    def client_line(self, line: int | None) -> int: ...
    def engine_line(self, line: int) -> int: ...
    def client_column(self, column: int) -> int: ...
