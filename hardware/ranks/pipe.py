"""The pipe between the coordinator and a rank's engine: one JSON object per line, each way.

To a rank: {"op": ..., ...} requests (the coordinator waits for each answer, with a deadline); "pause" and
"close" are read at once, even while the rank is busy in a motion. From a rank: {"ok": true, "result": ...} or
{"ok": false, "error": "words"}. Both sides are ours, but a rank runs the user's code: a line that is not a JSON
object is a broken rank, said so, never obeyed.
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any

from hardware.errors import RewindError
from hardware.jsonable import json_safe

MAX_LINE = 64 * 2**20


class PipeClosed(RewindError):
    """The other end is gone (the rank's process ended), or sent what is no message."""


class Pipe:
    def __init__(self, fd_in: int, fd_out: int):
        self.fd_in, self.fd_out = fd_in, fd_out
        self._buffer = bytearray()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(json_safe(message), allow_nan=False).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self.fd_out, data):]
        except OSError:
            raise PipeClosed("the other end of the pipe is gone") from None

    def receive(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message; a TimeoutError when none arrives within `timeout` seconds (None: wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.fd_in], [], [], left)
            if not ready:
                raise TimeoutError
            chunk = os.read(self.fd_in, 1 << 16)
            if not chunk:
                raise PipeClosed("the pipe closed")
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE:
                raise PipeClosed(f"a message over {MAX_LINE // 2**20} MiB")
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        try:
            message = json.loads(line)
        except ValueError:
            raise PipeClosed("a line that is not JSON") from None
        if not isinstance(message, dict):
            raise PipeClosed("a line that is not a JSON object")
        return message

    def close(self) -> None:
        for fd in {self.fd_in, self.fd_out}:
            try:
                os.close(fd)
            except OSError:
                pass
