"""Requests to answers, inside the engine process: the DAP requests' handlers and the one Adapter they share.

A Dispatcher takes requests the front (dap_server/server.py) has already framed and checked, checks
each request's arguments against its handler's model and answers. Handlers marked `on_loop` answer on
the event loop; all others queue, in arrival order, on the Adapter's single worker thread that owns the
Session. Whatever goes wrong with one request is answered with an error response and the session goes on:
a program that calls `sys.exit()` or raises a keyboard interrupt ends the request, not the engine.

Outgoing messages leave as channel.Messages, JSON text without `seq`: the front numbers what the client receives.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from dap_server import (addresses, attach, breakpoints, compare, custom, evaluate, experiments,  # noqa: F401
                        forensics, frames, instructions, lifecycle, memory, numerics, reference_memory, repair, sources,
                        stepping, traces, variables)  # importing a module registers its requests
from dap_server.adapter import Adapter
from dap_server.failures import ExpiredReference, describe_failure
from dap_server import protocol
from dap_server.channel import Message
from dap_server.protocol import encode_body
from dap_server.requests import REQUESTS, Handler
from hardware.errors import RewindError, echo

log = logging.getLogger("dap_server")
MAX_RESPONSE_BYTES = 8 * 2**20  # one answer; a page of variables or memory is far smaller
MAX_OUTPUT_CHARS = 64 * 2**10  # one output event's text


class Dispatcher:
    def __init__(self, deliver: Callable[[Message], None], notify: Callable[[str, dict], None] | None = None):
        self.deliver = deliver  # called on the event loop, in order
        self.loop = asyncio.get_running_loop()
        self.adapter = Adapter(self.emit, notify or (lambda kind, body: None))
        self._tasks: set[asyncio.Task] = set()  # answers in flight (the loop keeps only weak references)
        self.done = asyncio.Event()  # set once `disconnect` is answered

    def close(self) -> None:
        self.adapter.close()

    # -- requests -------------------------------------------------------------------------------
    def accept(self, message: dict[str, Any]) -> None:
        handler = REQUESTS.get(message["command"])
        if handler is None:
            known = ", ".join(sorted(REQUESTS))
            self.respond_error(message, RewindError(f"unknown request '{echo(message['command'])}' (known: {known})"))
        elif handler.on_loop:
            self._answer_now(message, handler)
        else:
            task = asyncio.ensure_future(self._answer(message, handler))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _answer_now(self, message: dict[str, Any], handler: Handler) -> None:
        try:
            body = handler.fn(self.adapter, handler.parse(message.get("arguments")))
        except Exception as exc:
            self.respond_error(message, exc)
        else:
            self._respond(message, body)

    async def _answer(self, message: dict[str, Any], handler: Handler) -> None:
        try:
            args = handler.parse(message.get("arguments"))
            if handler.interrupts:
                self.adapter.pause()
            body, motion = await self.adapter.call(message["seq"], handler, args)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # the user's code may raise either of the two
            self.respond_error(message, exc)
            return
        self._respond(message, body)
        if motion is not None:
            self.adapter.start_motion(message["seq"], motion)
        if self.adapter.closing:
            self.done.set()

    # -- writing --------------------------------------------------------------------------------
    def emit(self, event: str, body: dict | None = None) -> None:
        """Thread-safe: send an event (from the worker, a timer, or the loop itself) in order."""
        try:
            self.loop.call_soon_threadsafe(self._send_event, event, body)
        except RuntimeError:  # the loop is closed: the client is gone
            pass

    def _send_event(self, event: str, body: dict | None) -> None:
        if event == "output" and body and len(body.get("output", "")) > MAX_OUTPUT_CHARS:
            text = body["output"]
            body = {**body, "output": text[:MAX_OUTPUT_CHARS] + f"\n… ({len(text) - MAX_OUTPUT_CHARS} more "
                                                                 "characters not shown)\n"}
        self.deliver(Message("event", encode_body(protocol.event(event, body)), event=event))

    def _respond(self, request: dict[str, Any], body: Any) -> None:
        try:
            data = encode_body(protocol.response(request, body))
        except (TypeError, ValueError) as exc:  # a body that is not JSON is our bug; the client still gets an answer
            log.exception("response to %s is not JSON: %s", request["command"], exc)
            self.respond_error(request, RewindError(f"Rewind could not put its answer to '{request['command']}' "
                                                    "into JSON (a bug in Rewind; the server log has details)"))
            return
        if len(data) > MAX_RESPONSE_BYTES:
            self.respond_error(request, RewindError(
                f"the answer to '{request['command']}' would be {len(data) / 2**20:.1f} MiB, over the "
                f"{MAX_RESPONSE_BYTES // 2**20} MiB one response may carry: ask for less (a smaller count or slice)"))
            return
        self.deliver(Message("response", data, True, request["seq"], request["command"]))

    def respond_error(self, request: dict[str, Any], exc: BaseException) -> None:
        command = request.get("command") or ""
        text = describe_failure(command, exc)
        message = protocol.error_response(request, text, echo(command), not isinstance(exc, ExpiredReference))
        self.deliver(Message("response", encode_body(message), False, request["seq"], command))

