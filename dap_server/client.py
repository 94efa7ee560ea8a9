"""A DAP client on debugpy's message channel: the console, the tests and the benchmark all drive the server with it.

debugpy's `JsonMessageChannel` (an internal API of the pinned debugpy 1.8.22) does the framing and
the request/response bookkeeping. A channel exits the process when a message has no handler, so
this client always installs generic `event` and `request` handlers, and every handler body is
wrapped: nothing the server sends can take the client down.
"""

from __future__ import annotations

import collections
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from debugpy.common import log as debugpy_log
from debugpy.common.messaging import JsonIOStream, JsonMessageChannel, MessageHandlingError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 120.0


class DapError(Exception):
    """The server answered a request with success: false."""

    def __init__(self, command: str, message: str):
        super().__init__(f"{command}: {message}")
        self.command, self.message = command, message


class _ObservedStream(JsonIOStream):
    """Hands every message read from the server to an observer (the tests validate each one)."""

    observe: Callable[[dict], None] = staticmethod(lambda message: None)

    def read_json(self, decoder=None):
        message = super().read_json(decoder)
        try:
            self.observe(message)
        except Exception as exc:  # an observer's bug must not kill the channel's reader thread
            print(f"rewind client: observer failed: {exc!r}", file=sys.stderr)
        return message


class DapClient:
    def __init__(self, stream: _ObservedStream, process: subprocess.Popen | None = None):
        self.process = process
        self.events: list[tuple[str, dict]] = []  # every event, in order
        self._consumed = 0  # events before this index were returned by wait_for or skipped
        self._cond = threading.Condition()
        self.closed = threading.Event()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=200)
        self.channel = JsonMessageChannel(stream, _Handlers(self), name="rewind-client")
        self.channel.start()

    # -- connecting --------------------------------------------------------------------------------
    @classmethod
    def spawn(cls, args: list[str] | None = None, observe: Callable[[dict], None] | None = None,
              stderr_to: Any = None, cwd: str | Path | None = None) -> "DapClient":
        """Start `python -m dap_server` (stdio) as a child process and talk to it over its pipes."""
        process = subprocess.Popen([sys.executable, "-m", "dap_server", *(args or [])], cwd=str(cwd or ROOT),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=stderr_to if stderr_to is not None else subprocess.PIPE)
        stream = _ObservedStream(process.stdout, process.stdin, "rewind-stdio")
        if observe:
            stream.observe = observe
        client = cls(stream, process)
        if stderr_to is None:
            threading.Thread(target=client._drain_stderr, daemon=True).start()
        return client

    @classmethod
    def connect(cls, host: str, port: int, observe: Callable[[dict], None] | None = None,
                timeout: float = 10.0) -> "DapClient":
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        reader = sock.makefile("rb")  # buffered: debugpy reads headers a line at a time
        writer = sock.makefile("wb", buffering=0)

        def cleanup() -> None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

        stream = _ObservedStream(reader, writer, f"rewind-tcp-{port}", cleanup)
        if observe:
            stream.observe = observe
        return cls(stream)

    def _drain_stderr(self) -> None:
        for line in self.process.stderr:
            self.stderr_tail.append(line.decode("utf-8", "replace").rstrip("\n"))

    # -- requests -------------------------------------------------------------------------------------
    def request(self, command: str, arguments: dict | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> dict:
        """Send a request and wait for its response: the body, or DapError with the server's message."""
        response = self.send(command, arguments).wait(timeout)
        if not response.success:
            raise DapError(command, str(response.body))
        return response.body

    def send(self, command: str, arguments: dict | None = None) -> "Pending":
        return Pending(self.channel.send_request(command, arguments))

    def write_raw(self, data: bytes) -> None:
        """Bytes straight onto the wire (tests of malformed input), between whole messages."""
        with self.channel:
            self.channel.stream._writer.write(data)
            self.channel.stream._writer.flush()

    # -- events ------------------------------------------------------------------------------------------
    def _record(self, name: str, body: dict) -> None:
        with self._cond:
            self.events.append((name, body))
            self._cond.notify_all()

    def wait_for(self, event: str, predicate: Callable[[dict], bool] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, after: int = 0) -> dict:
        """The next event named `event` (matching `predicate`, at or after index `after`) not yet returned."""
        return self.wait_for_any((event,), predicate, timeout, after)[1]

    def wait_for_any(self, events: tuple[str, ...], predicate: Callable[[dict], bool] | None = None,
                     timeout: float = DEFAULT_TIMEOUT_S, after: int = 0) -> tuple[str, dict]:
        """The next event named any of `events` (as `wait_for`), with its name."""
        with self._cond:
            def find() -> int | None:
                for i in range(max(self._consumed, after), len(self.events)):
                    name, body = self.events[i]
                    if name in events and (predicate is None or predicate(body)):
                        return i
                return None

            self._cond.wait_for(lambda: find() is not None or self.closed.is_set(), timeout)
            index = find()
            if index is None:
                why = "the connection closed" if self.closed.is_set() else f"{timeout:.0f} s passed"
                raise TimeoutError(f"no '{' or '.join(events)}' event: {why}; last events: {self._recent()}")
            self._consumed = index + 1
            return self.events[index]

    def events_since(self, mark: int) -> list[tuple[str, dict]]:
        with self._cond:
            return list(self.events[mark:])

    def mark(self) -> int:
        with self._cond:
            return len(self.events)

    def _recent(self) -> list[str]:
        return [name for name, _ in self.events[-8:]]

    # -- closing -------------------------------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        self.channel.close()
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Pending:
    """A request on its way: wait for its response with a timeout (debugpy's own wait has none)."""

    def __init__(self, request):
        self._request = request
        self._done = threading.Event()
        request.on_response(lambda response: self._done.set())

    @property
    def seq(self) -> int:
        return self._request.seq

    def wait(self, timeout: float = DEFAULT_TIMEOUT_S):
        if not self._done.wait(timeout):
            raise TimeoutError(f"no response to '{self._request.command}' within {timeout:.0f} s")
        return self._request.response


class _Handlers:
    """Generic handlers for everything the server may send; a missing one would exit the process."""

    def __init__(self, client: DapClient):
        self.client = client

    def event(self, event) -> None:
        try:
            self.client._record(event.event, dict(event.body))
        except Exception as exc:
            print(f"rewind client: event handler failed: {exc!r}", file=sys.stderr)

    def request(self, request):
        try:
            return MessageHandlingError(f"the Rewind client does not handle '{request.command}' requests")
        except Exception as exc:  # never let a reverse request take the client down
            return MessageHandlingError(repr(exc))

    def disconnect(self) -> None:
        try:
            self.client.closed.set()
            with self.client._cond:
                self.client._cond.notify_all()
        except Exception as exc:
            print(f"rewind client: disconnect handler failed: {exc!r}", file=sys.stderr)


def quiet_debugpy_log() -> None:
    """debugpy logs warnings to stderr; an interactive console has its own way of reporting."""
    debugpy_log.stderr.levels = []
