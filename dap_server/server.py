"""The DAP server's front, the adapter process: transports, trust, and one engine process per session.

A ClientConnection reads a client's bytes, lets protocol.MessageReader frame them, and hands each request
to its session's engine: a child process (dap_server/engine.py) that holds the Session and runs the user's
code, spoken to over a pipe (dap_server/channel.py). The front never imports torch nor the user's code,
so nothing a program does reaches it: when an engine exits, crashes or hangs, the front answers every
request still pending with what happened, sends `output` and `terminated`, and keeps serving (a later
`launch` starts a fresh engine). When the session was recording, the recording is kept and offered for
reopening at its last complete step (`terminated`'s `restart` carries `{"trace": PATH}`).

TCP serves connections concurrently, each with its own engine, up to `--max-sessions`; a connection that
has not sent `initialize` within `--handshake-timeout`, or leaves a message incomplete for
`--frame-timeout`, is closed. A bind beyond loopback needs `--allow-remote` and a token (`--token` or
REWIND_TOKEN) that the client passes as `rewindToken` in `initialize`'s arguments: launch runs Python.

With $REWIND_ENGINE_POOL set, an engine is forked by the engine pool instead of started here (dap_server/pool/,
docs/engine-pool.md): the same engine, its own process, a fraction of a second instead of an interpreter and torch's
import; when the pool gives none, the engine is started here as always.

`--in-process` runs the engine inside the server (benchmarks compare the two; a program that exits then
takes the server down with it).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

from checkpoint.safe_files import partials_of
from dap_server import channel, pool, protocol
from dap_server.protocol import FramingError, MessageReader, encode_body, frame, with_seq
from hardware.errors import echo

log = logging.getLogger("dap_server")
READ_CHUNK = 1 << 16
_STOPPING = ("terminate", "disconnect")
_DONE_WHEN_ENDED = (*_STOPPING, "pause", "cancel", "threads")  # what these ask for is what an engine's end gives
_LOADING = ("launch", "restart")  # requests that run the user's build()
_RUNS_PROGRAM_CODE = (*_LOADING, "addPatch", "repair", "measureBranch")  # ... or a fix file's functions
_MOTIONS = ("configurationDone", "continue", "reverseContinue", "next", "stepIn", "stepOut", "stepBack", "goto",
            "restart", "restoreCheckpoint")  # answered first, then they run until a `stopped` event
_CRASH_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"}


@dataclass
class ServerOptions:
    token: str | None = None  # clients must pass it as initialize's `rewindToken`
    handshake_timeout: float | None = None  # seconds from connecting to `initialize` (TCP)
    frame_timeout: float | None = None  # seconds one message may stay incomplete (TCP)
    stop_grace: float = 5.0  # seconds an engine gets to answer terminate/disconnect, or to leave build() after pause
    max_sessions: int = 8
    in_process: bool = False
    log_level: str = "WARNING"


class Writer(Protocol):
    """An asyncio write transport, or a StreamWriter over one."""

    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def is_closing(self) -> bool: ...


class ClientConnection:
    """One client: framing, the token, timeouts, and the engine its requests go to."""

    def __init__(self, reader: asyncio.StreamReader, writer: Writer, options: ServerOptions,
                 refuse: str | None = None):
        self.reader, self.writer, self.options = reader, writer, options
        self.loop = asyncio.get_running_loop()
        self.refusal = refuse  # every request is answered with this, then the connection closes
        self.authenticated = options.token is None
        self.initialized = False
        self.engine: EngineLink | InProcessEngine | None = None
        self.configuration = Configuration()  # replayed to a fresh engine after one ended
        self._seq = 0
        self.done = asyncio.Event()

    async def serve(self) -> None:
        reading = asyncio.ensure_future(self._read())
        closing = asyncio.ensure_future(self.done.wait())
        try:
            await asyncio.wait({reading, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            reading.cancel()
            closing.cancel()
            if self.engine is not None:
                await self.engine.close()
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
        opened = self.loop.time()
        frame_started: float | None = None
        try:
            while True:
                data = await self._next_chunk(opened, frame_started)
                if not data:
                    break
                for item in framer.feed(data):
                    if isinstance(item, FramingError):
                        self._refuse(item)
                    else:
                        await self._accept_guarded(item)
                    if self.done.is_set():
                        return
                frame_started = (frame_started or self.loop.time()) if framer.partial else None
        except TimeoutError as exc:  # before OSError, of which it is a kind
            self.send_event("output", {"category": "important", "output": f"Rewind closed the connection: {exc}\n"})
        except (ConnectionError, OSError) as exc:
            log.info("connection lost: %s", exc)

    async def _next_chunk(self, opened: float, frame_started: float | None) -> bytes:
        """The client's next bytes, within the time the handshake and an incomplete message are allowed."""
        limits = []
        if not self.initialized and self.options.handshake_timeout is not None:
            limits.append((opened + self.options.handshake_timeout,
                           f"no 'initialize' within {self.options.handshake_timeout:g} s of connecting"))
        if frame_started is not None and self.options.frame_timeout is not None:
            limits.append((frame_started + self.options.frame_timeout,
                           f"a message stayed incomplete for {self.options.frame_timeout:g} s"))
        if not limits:
            return await self.reader.read(READ_CHUNK)
        deadline, why = min(limits)
        try:
            return await asyncio.wait_for(self.reader.read(READ_CHUNK), max(0.0, deadline - self.loop.time()))
        except TimeoutError:
            raise TimeoutError(why) from None

    # -- requests -------------------------------------------------------------------------------
    async def _accept_guarded(self, message: dict[str, Any]) -> None:
        """Whatever a request holds, it is answered and the connection goes on."""
        try:
            await self._accept(message)
        except channel.ChannelError as exc:
            self.respond_error(message, f"{echo(message['command'])}: {exc}")
        except Exception:  # our bug: the client still gets an answer, the log gets the details
            log.exception("front: %s", echo(message["command"]))
            self.respond_error(message, f"Rewind could not handle '{echo(message['command'])}' (a bug in Rewind; "
                                        "the server log has the details)")

    async def _accept(self, message: dict[str, Any]) -> None:
        command = message["command"]
        if self.refusal is not None:
            self.respond_error(message, self.refusal)
            self.done.set()
            return
        if not self.authenticated:
            if not self._token_matches(message):
                self.respond_error(message, "this Rewind server needs a token: pass it as 'rewindToken' in the "
                                            "arguments of 'initialize' (see --token in docs/protocol.md)")
                self.done.set()
                return
            self.authenticated = True
        if command == "initialize":
            arguments = message.get("arguments")
            if isinstance(arguments, dict):
                message = {**message, "arguments": {k: v for k, v in arguments.items() if k != "rewindToken"}}
            self.initialized = True
        if command == "launch":
            message = _reopening(message)
        self.configuration.remember(message)
        if self.engine is None or self.engine.ended is not None:
            if not await self._engine_for(message):
                return
        self.engine.forward(message)

    async def _engine_for(self, message: dict[str, Any]) -> bool:
        """An engine to take `message`: the first one, or a fresh one for a `launch` or a `restart` after the
        last one ended. Other requests after an engine ended are answered here."""
        command, ended = message["command"], self.engine.ended if self.engine is not None else None
        if ended is not None and command not in ("launch", "restart"):
            if command in _STOPPING:
                self.respond(message, None)
                if command == "disconnect":
                    self.done.set()
            elif command == "threads":
                self.respond(message, {"threads": []})
            else:
                self.respond_error(message, f"this debug session has ended ({ended}); send 'launch' to start "
                                            "a new one")
            return False
        kept = getattr(self.engine, "kept", None)
        self.engine = InProcessEngine(self) if self.options.in_process else EngineLink(self)
        await self.engine.start()
        if ended is not None:
            for silent in self.configuration.replay(restart=message if command == "restart" else None, kept=kept):
                self.engine.forward(silent, answer=False)
            if command == "restart":  # the engine is launched again: the restart runs it from tick 0
                message.pop("arguments", None)
        return True

    def _token_matches(self, message: dict[str, Any]) -> bool:
        arguments = message.get("arguments")
        given = arguments.get("rewindToken") if message["command"] == "initialize" and isinstance(arguments, dict) \
            else None
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.options.token.encode())

    # -- writing --------------------------------------------------------------------------------
    def send_json(self, body: bytes) -> None:
        """Send a message given as JSON text without `seq`: every message the client receives is numbered here."""
        self._seq += 1
        if not self.writer.is_closing():
            self.writer.write(frame(with_seq(self._seq, body)))

    def send_event(self, event: str, body: dict | None) -> None:
        self.send_json(encode_body(protocol.event(event, body)))

    def respond(self, request: dict[str, Any], body: Any) -> None:
        self.send_json(encode_body(protocol.response(request, body)))

    def respond_error(self, request: dict[str, Any], text: str) -> None:
        self.send_json(encode_body(protocol.error_response(request, text, echo(request.get("command") or ""))))

    def _refuse(self, error: FramingError) -> None:
        log.warning("refused input: %s", error.message)
        if error.seq is not None:
            self.respond_error({"seq": error.seq, "command": error.command or ""}, error.message)
        else:
            self.send_event("output", {"category": "important", "output": f"Rewind refused a message: {error.message}\n"})


_CONFIGURING = ("setBreakpoints", "setFunctionBreakpoints", "setExceptionBreakpoints", "setDataBreakpoints",
                "setInstructionBreakpoints")


class Configuration:
    """How the client set its session up (initialize, launch, the latest breakpoints of each kind), so that a
    fresh engine can be brought back to it when the client restarts a session whose engine ended."""

    def __init__(self) -> None:
        self.initialize: dict | None = None
        self.launch: dict | None = None
        self.breakpoints: dict[Any, dict] = {}
        self.cwd: str | None = None  # the working directory the client's last launch gave (the engine checks it)
        self._seq = 0

    def remember(self, message: dict[str, Any]) -> None:
        command, arguments = message["command"], message.get("arguments")
        if command == "initialize":
            self.initialize = message
        elif command == "launch":
            self.launch, self.breakpoints = message, {}
            self.cwd = _cwd_of(arguments)
        elif command == "restart" and isinstance(arguments, dict):
            self.cwd = _cwd_of(arguments.get("arguments")) or self.cwd  # a relaunch without `cwd` keeps it
        elif command in _CONFIGURING:
            source = arguments.get("source") if isinstance(arguments, dict) else None
            path = source.get("path") if isinstance(source, dict) else None
            key = (command, path if isinstance(path, str) else None)
            self.breakpoints[key] = message

    def replay(self, restart: dict | None, kept: str | None) -> list[dict[str, Any]]:
        """Requests (numbered below zero: the client never sees their answers) that bring a fresh engine to
        where the client left its session: initialized; for a restart also launched (opening the recording
        `kept` the last engine left, if any) with the same breakpoints."""
        out = [self.initialize] if self.initialize is not None else []
        if restart is not None:
            arguments = restart.get("arguments")
            launch = arguments.get("arguments") if isinstance(arguments, dict) else None
            if not isinstance(launch, dict):
                launch = (self.launch or {}).get("arguments") or {}
            if self.cwd is not None and isinstance(launch, dict) and "cwd" not in launch:
                launch = {**launch, "cwd": self.cwd}  # relative paths mean what they meant: the session keeps it
            if kept is not None:
                launch = {**launch, "__restart": {"trace": kept}}
            out.append(_reopening({"seq": 0, "type": "request", "command": "launch", "arguments": launch}))
            out += self.breakpoints.values()
        numbered = []
        for message in out:
            self._seq -= 1
            numbered.append({**message, "seq": self._seq})
        return numbered


def _cwd_of(arguments: Any) -> str | None:
    """A launch's `cwd`, when it is an absolute path (the engine says what is wrong with any other)."""
    cwd = arguments.get("cwd") if isinstance(arguments, dict) else None
    return cwd if isinstance(cwd, str) and "\0" not in cwd and os.path.isabs(cwd) else None


def _session_path(path: str, cwd: str | None) -> str | None:
    """A path a request gave, as the engine takes it: a relative one from the session's working directory (the
    launch's `cwd`, else the one the engine inherited from this process); None when there is none any more."""
    if os.path.isabs(path):
        return path
    try:
        return os.path.join(cwd or os.getcwd(), path)
    except OSError:
        return None


def _reopening(message: dict[str, Any]) -> dict[str, Any]:
    """A launch that restarts a session whose engine died while recording (the `restart` of our `terminated`):
    it opens the recording instead of running the program again."""
    arguments = message.get("arguments")
    restart = arguments.get("__restart") if isinstance(arguments, dict) else None
    if not (isinstance(restart, dict) and isinstance(restart.get("trace"), str)):
        return message
    kept = {k: v for k, v in arguments.items() if k not in ("program", "record", "overwrite", "__restart")}
    return {**message, "arguments": {**kept, "trace": restart["trace"]}}


class InProcessEngine:
    """The engine inside the server process: the same Dispatcher, no pipe (benchmarks, debugging Rewind)."""

    ended: str | None = None

    def __init__(self, connection: ClientConnection):
        self.connection = connection

    async def start(self) -> None:
        from dap_server.dispatch import Dispatcher  # deferred: the front imports torch only when asked to

        self.dispatcher = Dispatcher(lambda out: self.connection.send_json(out.json))
        self._watch = asyncio.ensure_future(self._closing())

    async def _closing(self) -> None:
        await self.dispatcher.done.wait()
        self.connection.done.set()

    def forward(self, message: dict[str, Any], answer: bool = True) -> None:
        self.dispatcher.accept(message)

    async def close(self) -> None:
        self._watch.cancel()
        self.dispatcher.close()


class EngineLink:
    """One engine process: requests forwarded, what it sends delivered, its end noticed and explained."""

    def __init__(self, connection: ClientConnection):
        self.connection = connection
        self.grace = connection.options.stop_grace
        self.pending: dict[int, str] = {}  # request seq -> command, until the engine answers
        self.silent: set[int] = set()  # requests whose answers the client never asked for (a replayed initialize)
        self.recording: channel.Recording | None = None
        self.ended: str | None = None  # why the engine is gone, once it is
        self.stop_reason: str | None = None  # set when the front stops the engine itself
        self.terminated_sent = False
        self.closing = False
        self.kept: str | None = None  # the recording this engine left when it ended
        self.saves: dict[int, tuple[str, float]] = {}  # saveTrace requests in flight: their path, when sent
        self.moving = False  # a motion was answered and has not stopped yet
        self.stops = 0  # `stopped` events so far
        self.quiet_initialized = 0  # `initialized` events of silent launches, not for the client
        self.join: str | None = None  # where the last launch's ranks join (a launch that waits for them), if any

    async def start(self) -> None:
        env = pool.engine_env(dict(os.environ))
        argv = ["--log-level", self.connection.options.log_level]
        self.process = await pool.started(argv, env, channel.MAX_FRAME) or await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dap_server.engine", *argv,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, limit=channel.MAX_FRAME)
        self._pump_task = asyncio.ensure_future(self._pump())

    def forward(self, message: dict[str, Any], answer: bool = True) -> None:
        seq, command = message["seq"], message["command"]
        frame = channel.pack(channel.Request(message))  # refuses what cannot cross the pipe, before it is pending
        self.pending[seq] = command
        arguments = message.get("arguments")
        if command == "saveTrace" and isinstance(arguments, dict) and isinstance(arguments.get("path"), str):
            path = _session_path(arguments["path"], self.connection.configuration.cwd)
            if path is not None:
                self.saves[seq] = (path, time.time())
        if not answer:
            self.silent.add(seq)
            self.quiet_initialized += command == "launch"
        if command in _LOADING:
            self._note_join(command, arguments)
        if command in _STOPPING:
            self._watch([seq], self._loading_words(command) or
                        f"the engine did not answer '{command}' within {self.grace:g} s")
        elif command == "pause" or (command == "cancel" and self._cancels_program_code(message)):
            self._watch_program_code(command)
        try:
            self.process.stdin.write(frame)
        except (ConnectionError, RuntimeError):  # the engine is gone: its end is being handled
            pass

    def _cancels_program_code(self, message: dict[str, Any]) -> bool:
        arguments = message.get("arguments")
        target = arguments.get("requestId") if isinstance(arguments, dict) else None
        return isinstance(target, int) and self.pending.get(target) in _RUNS_PROGRAM_CODE

    def _watch_program_code(self, command: str) -> None:
        """After a pause or a cancel, the program's own code (build(), a fix file's function) gets the grace
        period to give control back: a request running it must be answered, a motion must stop."""
        running = [s for s, c in self.pending.items() if c in _RUNS_PROGRAM_CODE]
        why = self._loading_words(command) or f"the program did not return within {self.grace:g} s after '{command}'"
        self._watch(running, why, motion=self.moving)

    def _note_join(self, command: str, arguments: Any) -> None:
        """A launch (or a restart's new launch arguments) with `join` waits for ranks started elsewhere to join: the
        engine is busy waiting for them, not in build()."""
        if command == "restart":
            if not isinstance(arguments, dict) or "arguments" not in arguments:
                return  # it launches as the last launch did
            arguments = arguments["arguments"]
        join = arguments.get("join") if isinstance(arguments, dict) else None
        self.join = join if isinstance(join, str) else None

    def _loading_words(self, command: str) -> str | None:
        """Why a launch still pending when `command` came has not given control back, in words (None: no launch
        is pending): its ranks have not all joined, or build() has not returned."""
        if not any(c in _LOADING for c in self.pending.values()):
            return None
        what = f"the ranks did not all join at {self.join}" if self.join else "build() did not return"
        return f"{what} within {self.grace:g} s after '{command}'"

    def _watch(self, seqs: list[int], why: str, motion: bool = False) -> None:
        """Stop the engine if any of these requests is still unanswered after the grace period (or, with
        `motion`, the motion that runs now has not stopped)."""
        stops = self.stops

        async def watchdog() -> None:
            await asyncio.sleep(self.grace)
            still_moving = motion and self.moving and self.stops == stops
            if self.ended is None and (still_moving or any(seq in self.pending for seq in seqs)):
                await self.stop(why)
        if seqs or motion:
            asyncio.ensure_future(watchdog())

    async def stop(self, why: str) -> None:
        """SIGTERM, then SIGKILL after the grace period; `_pump` then answers what is pending."""
        self.stop_reason = self.stop_reason or why
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), self.grace)
            except TimeoutError:
                self.process.kill()

    async def close(self) -> None:
        """The client is gone: let the engine finish (a recording is completed), or stop it."""
        self.closing = True
        if self.process.returncode is None:
            self.process.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), self.grace)
            except TimeoutError:
                await self.stop("the client left")
        await self._pump_task

    # -- from the engine ------------------------------------------------------------------------------
    async def _pump(self) -> None:
        try:
            async for item in channel.frames(self.process.stdout):
                self._deliver(item)
        except channel.ChannelError as exc:
            log.error("engine channel: %s", exc)
            await self.stop(f"it sent something unreadable ({exc})")
        await self._ended(await self.process.wait())

    def _deliver(self, item: channel.Frame) -> None:
        if isinstance(item, channel.Recording):
            self.recording = item
            return
        if not isinstance(item, channel.Message):
            return
        if item.kind == "response" and item.request_seq is not None:
            self.pending.pop(item.request_seq, None)
            self.saves.pop(item.request_seq, None)
            if item.request_seq in self.silent:
                self.silent.discard(item.request_seq)
                if b'"success":false' in item.json:  # the client must hear why its session did not come back
                    self.connection.send_event("output", {"category": "important", "output": (
                        f"Rewind could not bring the session back ({item.command}): "
                        f"{json.loads(item.json).get('message', '')}\n")})
                return
        if item.kind == "event" and item.event == "initialized" and self.quiet_initialized:
            self.quiet_initialized -= 1
            return
        if item.kind == "event" and item.event == "terminated":
            self.terminated_sent = True
        if item.kind == "event" and item.event in ("stopped", "terminated"):
            self.moving = False
            self.stops += 1
        elif item.kind == "response" and item.success and item.command in _MOTIONS:
            self.moving = True
        self.connection.send_json(item.json)
        if item.kind == "response" and item.command == "disconnect" and item.success:
            self.connection.done.set()

    async def _ended(self, returncode: int) -> None:
        """Answer every request still pending, tell the client why, offer the recording."""
        why = self.stop_reason or getattr(self.process, "unknown_end", None) or describe_exit(returncode)
        self.ended = why
        if self.closing and not self.pending:
            return
        for seq, command in sorted(self.pending.items()):
            if seq not in self.silent:
                self._answer_ended(seq, command, why)
        self.pending.clear()
        if self.connection.done.is_set():
            return
        self.kept = kept = self._keep_recording()
        note = (f" The recording up to that point is in {kept}: restart the session to open it at its last "
                f"complete step, or run `rewind debug --trace {kept}`." if kept else "")
        self.connection.send_event("output", {"category": "important",
                                              "output": f"The debug session's engine ended: {why}.{note}\n"})
        if not self.terminated_sent:
            self.connection.send_event("terminated", {"restart": {"trace": kept}} if kept else None)
            self.terminated_sent = True

    def _keep_recording(self) -> str | None:
        """The dead engine's partial recording, moved to the path the user asked for (it reads up to its last
        complete frame) unless a file the user did not allow to be replaced is there now; None when there is
        none. Where it stays, it stays under its partial name."""
        if self.recording is None or not os.path.isfile(self.recording.partial):
            return None
        partial, target = self.recording.partial, self.recording.target
        try:
            if self.recording.overwrite:
                os.replace(partial, target)
            else:
                os.link(partial, target)  # never replaces: fails where a file has appeared at the target
                os.unlink(partial)
        except OSError as exc:
            log.warning("the recording stays at %s: %s", partial, exc)
            return partial
        return target

    def _answer_ended(self, seq: int, command: str, why: str) -> None:
        """A request the engine took with it: what it asked for is done (pause, terminate, disconnect: the
        engine is gone; threads: there are none), or it failed for the engine's end."""
        if seq in self.saves:  # the save's temporary goes first; the file it was to replace is untouched
            path, since = self.saves.pop(seq)
            for partial in partials_of(path, since - 1):
                partial.unlink(missing_ok=True)
        request = {"seq": seq, "command": command}
        if command in _DONE_WHEN_ENDED:
            self.connection.respond(request, {"threads": []} if command == "threads" else None)
            if command == "disconnect":
                self.connection.done.set()
        else:
            self.connection.respond_error(request, f"{command}: the debug session's engine ended: {why}")


def describe_exit(returncode: int) -> str:
    """How an engine process ended, in words."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name in _CRASH_SIGNALS:
            return f"it crashed ({name}: a fault in native code, such as a kernel, an extension or ctypes)"
        if name == "SIGKILL":
            return "it was killed (SIGKILL; the system may have run out of memory)"
        return f"it was stopped by {name}"
    return f"its process exited with status {returncode} while the program ran (os._exit or a fatal error)"


# -- transports -------------------------------------------------------------------------------------
async def serve_stdio(options: ServerOptions) -> None:
    loop = asyncio.get_running_loop()
    protocol_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # nothing printed in this process may reach the protocol stream
    sys.stdout = sys.stderr
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, protocol_out)
    connection = ClientConnection(reader, transport, options)
    connection.engine = InProcessEngine(connection) if options.in_process else EngineLink(connection)
    await connection.engine.start()  # at once: it loads while the client starts
    await connection.serve()


async def serve_tcp(host: str, port: int, options: ServerOptions) -> None:
    live: set[ClientConnection] = set()

    async def serve_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        full = len(live) >= options.max_sessions
        refusal = (f"Rewind is serving {len(live)} debug sessions, its limit (--max-sessions {options.max_sessions}): "
                   "try again when one ends") if full else None
        connection = ClientConnection(reader, writer, options, refuse=refusal)
        log.info("session with %s begins%s", peer, " (refused: full)" if full else "")
        if not full:
            live.add(connection)
        try:
            await connection.serve()
        finally:
            live.discard(connection)
            log.info("session with %s ended", peer)

    server = await asyncio.start_server(serve_client, host, port)
    bound = server.sockets[0].getsockname()
    print(f"Rewind DAP server listening on {bound[0]}:{bound[1]}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dap_server",
                                     description="Rewind's Debug Adapter Protocol server (stdio unless --port).")
    parser.add_argument("--port", type=int, help="listen on TCP (0: any free port, printed on stderr)")
    parser.add_argument("--host", default="127.0.0.1", help="TCP address to listen on (default 127.0.0.1)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host beyond loopback (needs a token: launch runs Python)")
    parser.add_argument("--token", default=os.environ.get("REWIND_TOKEN"),
                        help="a shared secret clients pass as 'rewindToken' in initialize (default: $REWIND_TOKEN)")
    parser.add_argument("--max-sessions", type=int, default=8, help="concurrent TCP sessions (default 8)")
    parser.add_argument("--handshake-timeout", type=float, default=30.0,
                        help="seconds a TCP client has to send initialize (default 30)")
    parser.add_argument("--frame-timeout", type=float, default=30.0,
                        help="seconds a TCP message may stay incomplete (default 30)")
    parser.add_argument("--stop-grace", type=float, default=5.0,
                        help="seconds an engine gets to answer terminate/disconnect or to leave build() after "
                             "pause before it is stopped (default 5)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the engine inside the server (benchmarks; a program that exits ends the server)")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="rewind-dap %(levelname)s: %(message)s")
    if args.port is not None and not _loopback(args.host):
        if not args.allow_remote:
            parser.error(f"--host {args.host} is reachable from other machines, and launch runs Python there: "
                         "pass --allow-remote (with --token) if that is what you want")
        if not args.token:
            parser.error("--allow-remote needs a token (--token or REWIND_TOKEN) that clients must present")
    options = ServerOptions(stop_grace=args.stop_grace, max_sessions=args.max_sessions,
                            in_process=args.in_process, log_level=args.log_level)
    if args.port is not None:
        options.handshake_timeout, options.frame_timeout = args.handshake_timeout, args.frame_timeout
        options.token = args.token or None  # stdio's client started the server itself: it needs no token
    try:
        asyncio.run(serve_stdio(options) if args.port is None else serve_tcp(args.host, args.port, options))
    except KeyboardInterrupt:
        pass
