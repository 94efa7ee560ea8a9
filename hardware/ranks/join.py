"""Ranks that join the coordinator over TCP instead of being forked by it (docs/ranks.md, "Several hosts").

The coordinator listens on `join` (host:port); each rank, started by torchrun on any host (`python -m
hardware.ranks.worker --join HOST:PORT`, reading RANK and WORLD_SIZE), connects and says hello, one JSON line:
{"rank", "world_size", "token"}. The coordinator checks it (the world size its own, every rank 0..N-1 once, the
token the session's secret, $REWIND_JOIN_TOKEN); a bad hello is answered {"ok": false, "error": words} and the
connection closed, and the coordinator keeps waiting for proper ranks until its launch timeout. Once every rank
has joined each gets {"ok": true, "store": host:port} (the TCPStore of the process group), and from then on its
connection is its Pipe: the same JSON lines as a forked rank's pipes (a socket's fd reads and writes as a pipe's).
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import sys
import time
from typing import Callable

from hardware.errors import RewindError, echo
from hardware.ranks.launcher import RANK_MODULE
from hardware.ranks.pipe import Pipe, PipeClosed

TOKEN_ENV = "REWIND_JOIN_TOKEN"
HELLO_S = 5.0  # a connection must say hello within this long (one that does not is refused, not waited on)
CONNECT_S = 120.0  # a rank started before its coordinator listens tries again for this long
_RETRY_S = 0.2


class JoinedPipe(Pipe):
    """A rank's connection as its Pipe; closing it shuts the connection down, so the other end hears it at once."""

    def __init__(self, sock: socket.socket):
        self.socket = sock
        super().__init__(sock.fileno(), sock.fileno())

    def wait_closed(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the other end to close (a rank leaving after a close), dropping what it
        sends meanwhile."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self.receive(max(0.0, deadline - time.monotonic()))
        except (TimeoutError, PipeClosed, OSError):
            return

    def close(self) -> None:
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.socket.close()


def _say(words: str) -> None:
    print(f"rewind: {words}", file=sys.stderr, flush=True)


def join_command(address: str, world_size: int, token: str | None, module: str) -> str:
    """What to run on each host, in words (`token` None: the user's own, in their environment, is not shown)."""
    run = f"with your {TOKEN_ENV} set, run" if token is None else f"run {TOKEN_ENV}={token}"
    return (f"waiting for {world_size} rank(s) to join at {address}: on each host {run} torchrun "
            f"--nnodes NODES --nproc-per-node K ... -m {module} --join {address} (K ranks per host, "
            f"{world_size} in all)")


def address_of(given: str, what: str, example: str = "10.0.0.1:29400") -> tuple[str, int]:
    """The host and port of `given` (host:port; port 0: a free one), else a RewindError in words."""
    host, _, port = given.rpartition(":") if isinstance(given, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise RewindError(f"{what} '{echo(str(given))}' is not host:port (such as {example})")
    return host, int(port)


def store_beside(join: str | None) -> str | None:
    """Where the process group's store is served for ranks that join at `join`: its host, a free port (None: not
    joining)."""
    return None if join is None else f"{address_of(join, 'join')[0]}:0"


def joined_ranks(join: str, world_size: int, store: str, timeout_s: float, from_trace: bool,
                 say: Callable[[str], None] | None = None,
                 module: str = RANK_MODULE) -> list[tuple[None, JoinedPipe]]:
    """The coordinator's side: listen at `join`, say what to run on each host (`python -m module --join`; to `say`,
    else on stderr), and wait for every rank; (no pid, its pipe) per rank, in rank order."""
    say = say or _say
    if from_trace:
        raise RewindError("ranks opened from a trace index are started here, not joined: leave out join")
    listener = JoinListener(*address_of(join, "join"))
    given = os.environ.get(TOKEN_ENV)  # a token the user set is not printed
    token = given or secrets.token_hex(16)
    try:
        say(join_command(listener.address, world_size, None if given else token, module))
    except BaseException:  # the surface could not say it (its client gone): nobody can join, listen no more
        listener.close()
        raise
    pipes = listener.accept(world_size, token, store, timeout_s, say)
    return [(None, pipe) for pipe in pipes]


class JoinListener:
    """The coordinator's side: a listening socket on `address` (host:port; port 0: a free one)."""

    def __init__(self, host: str, port: int):
        try:
            self.socket = socket.create_server((host, port), backlog=64)
        except OSError as exc:
            raise RewindError(f"cannot listen for joining ranks at {echo(f'{host}:{port}')}: "
                              f"{exc.strerror or exc}") from None
        self.address = f"{host}:{self.socket.getsockname()[1]}"

    def accept(self, world_size: int, token: str, store: str, timeout_s: float,
               on_refused=None) -> list[JoinedPipe]:
        """Wait up to `timeout_s` for ranks 0..world_size-1 to join with `token`; welcome each (telling it `store`)
        and return their pipes in rank order. A hello that is wrong is refused in words to its sender (and to
        `on_refused`); a timeout is a RewindError naming the ranks that never joined."""
        joined: dict[int, JoinedPipe] = {}
        refused: list[str] = []
        deadline = time.monotonic() + timeout_s
        try:
            while len(joined) < world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RewindError(_never_joined(self.address, world_size, joined, refused, timeout_s))
                self.socket.settimeout(left)
                try:
                    conn, peer = self.socket.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                pipe = JoinedPipe(conn)
                rank, why = _checked_hello(pipe, world_size, token, joined, min(HELLO_S, max(0.1, left)))
                if why is not None:
                    refused.append(f"{peer[0]}: {why}")
                    if on_refused is not None:
                        on_refused(f"refused a rank from {peer[0]}: {why}")
                    _refuse(pipe, why)
                    continue
                joined[rank] = pipe
            for pipe in joined.values():
                pipe.send({"ok": True, "store": store})
        except BaseException:
            for pipe in joined.values():
                pipe.close()
            raise
        finally:
            self.socket.close()
        return [joined[r] for r in range(world_size)]

    def close(self) -> None:
        self.socket.close()


def _checked_hello(pipe: JoinedPipe, world_size: int, token: str, joined: dict,
                   timeout: float) -> tuple[int, str | None]:
    """The rank a connection's hello names, and why it is refused (None: welcome)."""
    try:
        hello = pipe.receive(timeout)
    except TimeoutError:
        return -1, f"it said no hello within {timeout:g} s"
    except (PipeClosed, OSError) as exc:
        return -1, f"its hello is not a rank's hello ({exc})"
    rank, size, given = hello.get("rank"), hello.get("world_size"), hello.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
        return -1, f"wrong join token (set {TOKEN_ENV} to the session's token)"
    if not isinstance(rank, int) or isinstance(rank, bool) or not isinstance(size, int) or isinstance(size, bool):
        return -1, "its hello has no whole-number rank and world_size"
    if size != world_size:
        return -1, f"rank {rank} says the world size is {size}; this session has {world_size} ranks"
    if not 0 <= rank < world_size:
        return -1, f"rank {rank} is not one of this session's ranks 0..{world_size - 1}"
    if rank in joined:
        return -1, f"rank {rank} has already joined"
    return rank, None


def _refuse(pipe: JoinedPipe, why: str) -> None:
    try:
        pipe.send({"ok": False, "error": f"refused: {why}"})
    except PipeClosed:
        pass
    pipe.close()


def _never_joined(address: str, world_size: int, joined: dict, refused: list[str], timeout_s: float) -> str:
    missing = [r for r in range(world_size) if r not in joined]
    said = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never joined at {address} " \
           f"within {timeout_s:g} s"
    return said + (f" (refused: {'; '.join(refused[-5:])})" if refused else "")


# -- the rank's side ---------------------------------------------------------------------------------------------
def rank_from_environment() -> tuple[int, int]:
    """RANK and WORLD_SIZE, as torchrun sets them; a RewindError in words when they are missing or not numbers."""
    found = []
    for name in ("RANK", "WORLD_SIZE"):
        text = os.environ.get(name, "")
        if not text.isdigit():
            raise RewindError(f"${name} is {echo(text) or 'not set'}: start the ranks with torchrun, which sets "
                              "RANK and WORLD_SIZE")
        found.append(int(text))
    return found[0], found[1]


def join(address: str, rank: int, world_size: int, token: str) -> tuple[str, JoinedPipe]:
    """Connect to the coordinator at `address` (trying again while it does not listen yet), say hello, and wait
    for its welcome; the store's host:port and the pipe. A refusal is a RewindError with the coordinator's words."""
    host, port = address_of(address, "--join")
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=_RETRY_S * 5)
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise RewindError(f"cannot reach the coordinator at {address}: {exc.strerror or exc}") from None
            time.sleep(_RETRY_S)
    sock.settimeout(None)
    pipe = JoinedPipe(sock)
    pipe.send({"rank": rank, "world_size": world_size, "token": token})
    try:
        welcome = pipe.receive()
    except (PipeClosed, OSError):
        raise RewindError(f"the coordinator at {address} closed the connection before welcoming rank {rank}") from None
    if not welcome.get("ok") or not isinstance(welcome.get("store"), str):
        raise RewindError(f"the coordinator at {address} {welcome.get('error') or 'sent no welcome'}")
    return welcome["store"], pipe


def joined_rank_main(address: str, run) -> int:
    """A rank started by torchrun: join the coordinator at `address`, then `run(rank, world_size, store, pipe)`
    (the rank's life); its exit code. What goes wrong before the rank runs is said on stderr."""
    try:
        rank, world_size = rank_from_environment()
        store, pipe = join(address, rank, world_size, os.environ.get(TOKEN_ENV, ""))
        return run(rank, world_size, store, pipe)
    except PipeClosed:
        print(f"rewind rank: the coordinator at {address} closed the connection", file=sys.stderr)
        return 1
    except RewindError as exc:
        print(f"rewind rank: {exc}", file=sys.stderr)
        return 1

