"""The processes behind a server, for tests that watch or end them: its engines, started by itself or forked for it
by the engine pool (dap_server/pool/)."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

from dap_server import pool


def children(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return [c for c in found if alive(c)]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_until(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def engines(server: int) -> list[int]:
    """The live engines of a server: its children (engines it started), and those the engine pool forked for it
    (the pool's children holding the server's pipes)."""
    pool_pid = pool_process()
    pipes = _pipes(server)
    pooled = [pid for pid in children(pool_pid) if _pipes(pid) & pipes] if pool_pid else []
    return sorted(children(server) + pooled)


def pool_process() -> int | None:
    """The pid of the engine pool $REWIND_ENGINE_POOL names (the process listening there), if one listens."""
    path = os.environ.get(pool.POOL_VARIABLE)
    if not path:
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(path)
        return struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    except OSError:
        return None
    finally:
        probe.close()


def _pipes(pid: int) -> set[str]:
    found = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("pipe:"):
            found.add(target)
    return found
