"""Warm engines: a pool process that has imported torch and Rewind's engine once forks the engine of each debug
session a DAP server asks it for, so a session starts in milliseconds instead of paying an interpreter and
torch's import (docs/engine-pool.md).

`rewind pool` (`python -m dap_server.pool`) runs the pool (forks.py) and says where it listens; a DAP server started
with $REWIND_ENGINE_POOL set to that socket asks it for each engine, and starts `python -m dap_server.engine` itself,
as without the pool, whenever the pool cannot give one (none listening, another Python or Rewind, an environment
that torch reads at import differing: `refused` says which). Each session still has a process of its own: a
program that exits, crashes or hangs ends only its engine, and the server hears how it ended from the pool, which
is the engine's parent and reaps it.

This side (the server's) imports nothing of torch: `started()` and `PooledEngine`, a process handle with what
dap_server/server.py uses of asyncio's (stdin, stdout, returncode, wait, terminate, kill).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path

POOL_VARIABLE = "REWIND_ENGINE_POOL"
ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the `dap_server` package
MAX_MESSAGE = 1 << 20  # bytes of one message on the pool's socket (a request carries the engine's environment)
ANSWER_S = 10.0  # seconds a server waits for the pool to fork an engine before starting one itself

log = logging.getLogger("dap_server.pool")


class PoolRefused(Exception):
    """Why the pool gave no engine, in words."""


def engine_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment an engine runs in: the server's, with this copy of Rewind first on PYTHONPATH (a pool must be
    started in the same, since what Python reads as it loads is compared)."""
    return {**environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, environ.get("PYTHONPATH")) if p)}


def request_for(argv: list[str], env: dict[str, str], cwd: str) -> bytes:
    """What a server asks the pool for: an engine run as `python -m dap_server.engine ARGV` would be, in `env` and
    `cwd`, by this Python and this copy of Rewind."""
    return json.dumps({"argv": argv, "env": env, "cwd": cwd, "executable": sys.executable, "root": ROOT}).encode()


async def started(argv: list[str], env: dict[str, str], limit: int) -> "PooledEngine | None":
    """An engine forked by the pool at $REWIND_ENGINE_POOL (in `env`), its stdout read with `limit`; None when no
    pool is named or it gave none (why is logged: the server then starts the engine itself)."""
    path = env.get(POOL_VARIABLE)
    if not path:
        return None
    try:
        return await _ask(path, argv, env, limit)
    except PoolRefused as why:
        log.info("the engine pool at %s gave no engine (%s): starting one here", path, why)
    except (OSError, ValueError, TimeoutError) as exc:
        log.info("the engine pool at %s could not be reached (%s): starting an engine here", path,
                 exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
    return None


async def _ask(path: str, argv: list[str], env: dict[str, str], limit: int) -> "PooledEngine":
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ends: list[int] = []
    try:
        sock.settimeout(ANSWER_S)
        sock.connect(path)
        engine_in, to_engine = os.pipe()
        from_engine, engine_out = os.pipe()
        ends = [engine_in, engine_out, to_engine, from_engine]
        socket.send_fds(sock, [request_for(argv, env, os.getcwd())], [engine_in, engine_out, 2])
        for fd in (engine_in, engine_out):  # the engine holds them now
            os.close(fd)
        ends = [to_engine, from_engine]
        sock.setblocking(False)
        answer, fds = await asyncio.wait_for(_receive(loop, sock), ANSWER_S)
        if "refused" in answer:
            raise PoolRefused(str(answer["refused"]))
        if not isinstance(answer.get("pid"), int) or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise PoolRefused("its answer was not one it gives")
        engine = PooledEngine(answer["pid"], fds[0], sock)
        await engine.connect(to_engine, from_engine, limit)
        return engine
    except BaseException:
        sock.close()
        for fd in ends:
            os.close(fd)
        raise


async def _receive(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[dict, list[int]]:
    """The pool's next message on `sock` and the descriptors it carries; {} when the pool closed the connection."""
    while True:
        ready = loop.create_future()
        loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(sock.fileno())
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
        except BlockingIOError:
            continue
        if not data:
            return {}, fds
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            for fd in fds:
                os.close(fd)
            raise PoolRefused("it sent something unreadable")
        return answer, fds


class PooledEngine:
    """An engine the pool forked, as the server sees it: its pipes, and how it ended (which the pool, its parent,
    tells). Signals go through its pidfd, so they reach this process and no other that might reuse its pid."""

    def __init__(self, pid: int, pidfd: int, sock: socket.socket):
        self.pid, self._pidfd, self._sock = pid, pidfd, sock
        self.returncode: int | None = None
        self.unknown_end: str | None = None  # set when the pool ended first, so the engine's end is not known
        self._ended = asyncio.Event()
        self.stdin: asyncio.StreamWriter
        self.stdout: asyncio.StreamReader

    async def connect(self, to_engine: int, from_engine: int, limit: int) -> None:
        loop = asyncio.get_running_loop()
        self.stdout = asyncio.StreamReader(limit=limit)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.stdout), os.fdopen(from_engine, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                            os.fdopen(to_engine, "wb", 0))
        self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        self._watch = asyncio.ensure_future(self._watch_end())

    async def _watch_end(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            answer, fds = await _receive(loop, self._sock)
            for fd in fds:
                os.close(fd)
            code = answer.get("exit")
        except (OSError, PoolRefused):
            code = None
        if not isinstance(code, int):  # the pool is gone: the engine's end is seen, how it ended is not
            gone = loop.create_future()
            loop.add_reader(self._pidfd, lambda: gone.done() or gone.set_result(None))
            try:
                await gone
            finally:
                loop.remove_reader(self._pidfd)
            self.unknown_end = "the engine pool that started it ended first, so how it ended is not known"
            code = 0
        self.returncode = code
        self._sock.close()
        os.close(self._pidfd)
        self._pidfd = -1
        self._ended.set()

    async def wait(self) -> int:
        await self._ended.wait()
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, number: int) -> None:
        if self.returncode is None:  # set, with the pidfd closed, once the engine has ended
            try:
                signal.pidfd_send_signal(self._pidfd, number)
            except ProcessLookupError:  # it has ended; the pool's word on how is on its way
                pass


def spawn(path: str, env: dict[str, str] | None = None, verbose: bool = False, stderr: int | None = None
          ) -> "subprocess.Popen":
    """Start `python -m dap_server.pool --socket PATH` in `env` (the environment the engines will be asked for with:
    what torch reads as it loads must be theirs) and return at once; `wait_ready` waits for it to listen."""
    import subprocess

    env = engine_env(os.environ if env is None else env)
    ready_r, ready_w = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-m", "dap_server.pool", "--socket", path, "--ready-fd",
                                    str(ready_w), *(["--verbose"] if verbose else [])], env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                   pass_fds=[ready_w])
    finally:
        os.close(ready_w)
    process.ready_fd = ready_r  # EOF on it once the pool listens (or has ended)
    return process


def wait_ready(process: "subprocess.Popen", timeout: float = 60.0) -> bool:
    """Whether a pool from spawn() listens now (waiting for it up to `timeout` seconds)."""
    import select

    if getattr(process, "ready_fd", None) is None:
        return process.poll() is None
    ready, _, _ = select.select([process.ready_fd], [], [], timeout)
    if ready:
        os.read(process.ready_fd, 1)
        os.close(process.ready_fd)
        process.ready_fd = None
    return bool(ready) and process.poll() is None
