"""The rank launcher: one process that imports torch and Rewind once, warms torch.export up, and forks the ranks of
every launch it is asked for (a fork server). A rank then starts in a fraction of a second instead of paying an
interpreter, torch's import and export's first-use cost of its own (docs/ranks.md).

The coordinator's side is `RankLauncher`: it starts `python -m <module> --rank-launcher FD`, whose main calls
`serve()` with how a forked rank runs (hardware/ranks/worker.py for the Python level, dap_server/engine.py for
ranks that also answer DAP requests), and asks it for ranks over a socket pair, handing it each rank's two pipe
ends. The launcher reaps the ranks it forked and writes each one's exit code next to its log, so the coordinator
can say how a rank ended. A rank prints into its log, and what its program prints on stdout into a file beside it
too, which the coordinator hands to its surface (`_Printed`).

Forking is safe only before torch starts a thread pool: the launcher runs nothing on tensors big enough for torch
to run in parallel (GNU OpenMP's threads do not survive a fork, and a child that starts a parallel region after
its parent ran one waits for them forever).
"""

from __future__ import annotations

import io
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from hardware.errors import RewindError
from hardware.frontends.torch_export import export_program
from hardware.ranks.pipe import Pipe

_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the `hardware` package
MAX_RANKS = 64  # processes on one host
MAX_RANK_OUTPUT = 2**20  # bytes of what a rank's program prints handed to its surface
_MAX_REQUEST = 1 << 16
_REAP_S = 0.1  # how often the launcher looks for ranks that have ended
_LOG_TAIL = 2000  # characters of the launcher's output quoted when it ends early

# How a forked rank runs: (rank, world size, rendezvous host:port, its pipe to the coordinator) -> its exit code.
RunRank = Callable[[int, int, str, Pipe], int]


RANK_MODULE = "hardware.ranks.worker"  # what a rank process runs, unless a surface has its own (dap_server.engine)


class RankLauncher:
    """The coordinator's handle on a launcher process. One may serve many launches, one after another (a test module,
    a debug session relaunched); `close()` ends it once the ranks it forked have ended."""

    def __init__(self, module: str = RANK_MODULE):
        self.module = module  # what a rank runs: also what torchrun starts for ranks that join (ranks/join.py)
        self._folder = Path(tempfile.mkdtemp(prefix="rewind-launcher-"))
        self._log = self._folder / "launcher.log"
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Ranks load through the program cache as one process does: a rank's entry is keyed by its rank too.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        with open(self._log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, "--rank-launcher", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
        theirs.close()
        self._socket = ours

    @property
    def pid(self) -> int:
        return self.process.pid

    def fork(self, world_size: int, store: str, folder: Path, timeout_s: float) -> list[tuple[int, Pipe]]:
        """Fork ranks 0..world_size-1, each logging to `folder`/rank{r}.log and working in this process's working
        directory; their pids and pipes, in rank order."""
        ends, theirs = [], []
        for _ in range(world_size):
            child_in, parent_out = os.pipe()
            parent_in, child_out = os.pipe()
            ends.append(Pipe(parent_in, parent_out))
            theirs += [child_in, child_out]
        request = {"world_size": world_size, "store": store, "folder": str(folder), "cwd": os.getcwd()}
        try:
            with self._lock:
                try:
                    socket.send_fds(self._socket, [json.dumps(request).encode()], theirs)
                except OSError:  # it has ended: say how
                    self._ended()
                reply = self._reply(timeout_s)
        except BaseException:
            for pipe in ends:
                pipe.close()
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return list(zip(reply["pids"], ends))

    def _reply(self, timeout_s: float) -> dict:
        ready, _, _ = select.select([self._socket], [], [], timeout_s)
        if not ready:  # its late answer would be read by the next launch: this launcher is not used again
            self.close()
            raise RewindError(f"the rank launcher did not start the ranks within {timeout_s:g} s")
        data = self._socket.recv(_MAX_REQUEST)
        if not data:
            self._ended()
        return json.loads(data)

    def _ended(self) -> None:
        code = self.process.wait()
        said = self._log.read_text(errors="replace").strip()[-_LOG_TAIL:]
        raise RewindError(f"the rank launcher ended (exit code {code}) before starting the ranks"
                          + (f"; its last output:\n{said}" if said else ""))

    def close(self) -> None:
        """No more launches: the launcher ends once the ranks it forked have (within a few seconds, else it is
        killed; its ranks end on their own when their coordinator closes their pipes)."""
        self._socket.close()
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self._folder, ignore_errors=True)


def exit_code(folder: Path, rank: int, timeout_s: float) -> int | None:
    """How rank `rank` of a launch into `folder` ended (its exit code; minus a signal's number), once the launcher has
    reaped it; None while it runs, after waiting up to `timeout_s`."""
    path = folder / f"rank{rank}.exit"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


# -- the launcher process ----------------------------------------------------------------------------------------
def serve(run_rank: RunRank, fd: int) -> None:
    """The launcher's life: warm up, then fork ranks as asked until the coordinator's side closes, then wait for
    the ranks to end. Never returns."""
    _warm_up()
    server = socket.socket(fileno=fd)
    children: dict[int, Path] = {}  # pid -> where its exit code goes
    while True:
        ready, _, _ = select.select([server], [], [], _REAP_S)
        if ready:
            data, fds, _, _ = socket.recv_fds(server, _MAX_REQUEST, 2 * MAX_RANKS)
            if not data:
                break
            request = json.loads(data)
            pids = _fork_ranks(run_rank, request, fds, server, children)
            server.send(json.dumps({"pids": pids}).encode())
        _reap(children, block=False)
    server.close()
    while children:
        _reap(children, block=True)
    os._exit(0)


def _warm_up() -> None:
    """Export a tiny module once: torch.export's first use (its imports, its caches) is then paid here, once,
    instead of in every rank. Its tensors are too small for torch to start a thread pool."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU())
    export_program(model, (torch.ones(1, 2),), name="warm_up")


def _fork_ranks(run_rank: RunRank, request: dict, fds: list[int], server: socket.socket,
                children: dict[int, Path]) -> list[int]:
    folder, world_size = Path(request["folder"]), int(request["world_size"])
    pids = []
    sys.stdout.flush()  # what the launcher printed stays in its own log, not copied into a rank's
    sys.stderr.flush()
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            _be_rank(run_rank, rank, request, fds, server)
        children[pid] = folder / f"rank{rank}.exit"
        pids.append(pid)
    for fd in fds:  # the ranks hold them now: a rank's end closes its pipes
        os.close(fd)
    return pids


def _be_rank(run_rank: RunRank, rank: int, request: dict, fds: list[int], server: socket.socket) -> None:
    """In the forked child: keep this rank's pipe ends only, print into its log, run it, and leave."""
    code = 1
    try:
        server.close()
        mine = fds[2 * rank:2 * rank + 2]
        for fd in fds:
            if fd not in mine:
                os.close(fd)
        log = os.open(Path(request["folder"]) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.stdout = io.TextIOWrapper(_Printed(Path(request["folder"]) / f"rank{rank}.stdout"), encoding="utf-8",
                                      errors="replace", write_through=True)
        os.chdir(request["cwd"])
        code = run_rank(rank, int(request["world_size"]), str(request["store"]), Pipe(*mine))
    except BaseException:  # a SystemExit from the user's code included: its code is the rank's
        exc = sys.exc_info()[1]
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        else:
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Printed(io.RawIOBase):
    """A rank's sys.stdout: what its program prints goes into its log, as everything the rank says does, and into a
    file of its own (`printed`), the first MAX_RANK_OUTPUT bytes and one more, which the coordinator reads after
    each answer of the rank and hands to its surface (the client sees a rank's prints; its log alone is quoted when
    the rank ends). Written at once, so what was printed is there before the rank answers."""

    def __init__(self, printed: Path):
        super().__init__()
        self._copy = os.open(printed, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self._left = MAX_RANK_OUTPUT + 1  # bytes still copied: the one over the limit says there were more

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        _write_all(1, data)
        if self._left:
            copied = data[:self._left]
            _write_all(self._copy, copied)
            self._left -= len(copied)
        return len(data)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _reap(children: dict[int, Path], block: bool) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        path = children.pop(pid, None)
        if path is not None:
            partial = path.with_suffix(".partial")
            try:
                partial.write_text(str(os.waitstatus_to_exitcode(status)))
                partial.rename(path)
            except OSError:  # the session's folder is gone: nobody asks how the rank ended
                pass
        if block:
            return
