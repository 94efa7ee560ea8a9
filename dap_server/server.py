"""The DAP server: transport (stdio, or TCP serving one session after another) and dispatch.

A Connection reads bytes, lets protocol.MessageReader frame them, checks each request's arguments
against its handler's model and answers. Handlers marked `on_loop` answer on the event loop;
all others queue, in arrival order, on the Adapter's single worker thread that owns the Session.
Whatever goes wrong with one message is answered (an error response, or an `output` event
when the message cannot be answered) and the connection keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any, Protocol

from dap_server import (addresses, attach, breakpoints, custom, evaluate, experiments, forensics,  # noqa: F401
                        frames, instructions, lifecycle, memory, reference_memory, repair, sources, stepping,
                        traces, variables)  # importing a module registers its requests
from dap_server.adapter import Adapter, Cancelled
from dap_server.protocol import FramingError, MessageReader, encode
from dap_server.requests import REQUESTS, Handler
from hardware.errors import RewindError

log = logging.getLogger("dap_server")
READ_CHUNK = 1 << 16
ERROR_ID = 1


class Writer(Protocol):
    """An asyncio write transport, or a StreamWriter over one."""

    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def is_closing(self) -> bool: ...


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: Writer):
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self.adapter = Adapter(self.emit)
        self._seq = 0
        self._tasks: set[asyncio.Task] = set()  # answers in flight (the loop keeps only weak references)
        self._done = asyncio.Event()

    async def serve(self) -> None:
        reading = asyncio.ensure_future(self._read())
        try:
            await self._done.wait()
        finally:
            reading.cancel()
            self.adapter.close()
            await self._flush()
            self.writer.close()

    async def _flush(self, limit_s: float = 2.0) -> None:
        """Let what is queued (the disconnect response) reach the client before the connection closes."""
        transport = getattr(self.writer, "transport", self.writer)
        deadline = self.loop.time() + limit_s
        while not transport.is_closing() and transport.get_write_buffer_size() and self.loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def _read(self) -> None:
        framer = MessageReader()
        try:
            while data := await self.reader.read(READ_CHUNK):
                for item in framer.feed(data):
                    if isinstance(item, FramingError):
                        self._refuse(item)
                    else:
                        self._accept(item)
        except (ConnectionError, OSError) as exc:
            log.info("connection lost: %s", exc)
        finally:
            self._done.set()

    # -- requests -------------------------------------------------------------------------------
    def _accept(self, message: dict[str, Any]) -> None:
        handler = REQUESTS.get(message["command"])
        if handler is None:
            known = ", ".join(sorted(REQUESTS))
            self._respond_error(message, RewindError(f"unknown request '{message['command']}' (known: {known})"))
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
            self._respond_error(message, exc)
        else:
            self._respond(message, body)

    async def _answer(self, message: dict[str, Any], handler: Handler) -> None:
        try:
            args = handler.parse(message.get("arguments"))
            if handler.interrupts:
                self.adapter.pause()
            body, motion = await self.adapter.call(message["seq"], handler, args)
        except Exception as exc:
            self._respond_error(message, exc)
            return
        self._respond(message, body)
        if motion is not None:
            self.adapter.start_motion(message["seq"], motion)
        if self.adapter.closing:
            self._done.set()

    # -- writing --------------------------------------------------------------------------------
    def emit(self, event: str, body: dict | None = None) -> None:
        """Thread-safe: send an event (from the worker, a timer, or the loop itself) in order."""
        try:
            self.loop.call_soon_threadsafe(self._send, {"type": "event", "event": event, **_body(body)})
        except RuntimeError:  # the loop is closed: the client is gone
            pass

    def _respond(self, request: dict[str, Any], body: Any) -> None:
        message = {"type": "response", "request_seq": request["seq"], "command": request["command"],
                   "success": True, **_body(body)}
        try:
            self._send(message)
        except (TypeError, ValueError) as exc:  # a body that is not JSON is our bug; the client still gets an answer
            log.exception("response to %s is not JSON", request["command"])
            self._respond_error(request, RuntimeError(f"internal error: the response is not JSON: {exc}"))

    def _respond_error(self, request: dict[str, Any], exc: BaseException) -> None:
        if isinstance(exc, Cancelled):
            text = "cancelled"
        elif isinstance(exc, RewindError):
            text = str(exc)
        else:
            log.error("%s failed", request.get("command"), exc_info=exc)
            text = f"internal error in {request.get('command')}: {type(exc).__name__}: {exc}"
        self._send({"type": "response", "request_seq": request["seq"], "command": request.get("command") or "",
                    "success": False, "message": text,
                    "body": {"error": {"id": ERROR_ID, "format": text, "showUser": True}}})

    def _refuse(self, error: FramingError) -> None:
        log.warning("refused input: %s", error.message)
        if error.seq is not None:
            self._respond_error({"seq": error.seq, "command": error.command}, RewindError(error.message))
        else:
            self.emit("output", {"category": "important", "output": f"Rewind refused a message: {error.message}\n"})

    def _send(self, message: dict[str, Any]) -> None:
        data = encode({"seq": self._seq + 1, **message})
        self._seq += 1
        if not self.writer.is_closing():
            self.writer.write(data)


def _body(body: Any) -> dict:
    return {} if body is None else {"body": body}


# -- transports -------------------------------------------------------------------------------------
async def serve_stdio() -> None:
    loop = asyncio.get_running_loop()
    protocol_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # whatever the user's model prints goes to stderr, never into the protocol stream
    sys.stdout = sys.stderr
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, protocol_out)
    await Connection(reader, transport).serve()


async def serve_tcp(host: str, port: int) -> None:
    one_at_a_time = asyncio.Lock()

    async def serve_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with one_at_a_time:
            peer = writer.get_extra_info("peername")
            log.info("session with %s begins", peer)
            await Connection(reader, writer).serve()
            log.info("session with %s ended", peer)

    server = await asyncio.start_server(serve_client, host, port)
    bound = server.sockets[0].getsockname()
    print(f"Rewind DAP server listening on {bound[0]}:{bound[1]}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dap_server",
                                     description="Rewind's Debug Adapter Protocol server (stdio unless --port).")
    parser.add_argument("--port", type=int, help="listen on TCP (0: any free port, printed on stderr)")
    parser.add_argument("--host", default="127.0.0.1", help="TCP address to listen on (default 127.0.0.1)")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="rewind-dap %(levelname)s: %(message)s")
    try:
        asyncio.run(serve_stdio() if args.port is None else serve_tcp(args.host, args.port))
    except KeyboardInterrupt:
        pass
