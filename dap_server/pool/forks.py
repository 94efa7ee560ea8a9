"""The engine pool's process: imports Rewind's engine (torch with it) once, listens on a Unix socket, and forks one
engine for each request (dap_server/pool/__init__.py is the servers' side, docs/engine-pool.md the whole story).

A request is one message on a SOCK_SEQPACKET connection: what the engine is to be (its arguments, environment and
working directory, and which Python and which copy of Rewind asks) with three descriptors, its stdin, stdout and
stderr. The pool answers with the engine's pid and a pidfd of it (the server signals it through that), then, when it
has reaped the engine, with its exit code; or it refuses, saying why, and the server starts the engine itself.

Only what a fork can give faithfully is given: the asking server's Python and copy of Rewind, the pool's code as it
was imported (a file of Rewind edited since is refused), and the environment torch and its libraries read when they
are loaded (threads, allocators, library paths, Python's own settings) as the pool has it. The rest of the
environment, and the working directory, are set in the forked engine before it starts. Forking is safe only before
torch starts a thread pool, and the pool runs no tensor code at all (hardware/ranks/launcher.py forks ranks the
same way). The peer of a connection must be this user.

The pool keeps serving whatever a request holds: a message it cannot read, a descriptor missing, a peer that leaves
are answered (or dropped) and forgotten. SIGTERM or SIGINT stops it listening; it ends once the engines it forked
have, so each server still hears how its engine ended (a second signal ends it at once).
"""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from dap_server.pool import MAX_MESSAGE, ROOT

# What torch and the libraries under it read from the environment as they load (thread pools, allocators, library
# paths, CUDA), and Python's own settings: an engine asking for other values than the pool's cannot be forked.
LOAD_TIME = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO_", "BLIS_", "TORCH", "PYTORCH_", "CUDA", "NVIDIA_",
             "NCCL_", "LD_", "MALLOC_", "PYTHON", "XDG_CACHE_HOME")
# ... and what a library reads as it loads, when the pool has loaded it (the engine imports Triton only for a kernel
# file, so TRITON_INTERPRET set for a session is read there, after the fork)
LOADED_LATER = {"TRITON_": "triton"}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_BACKLOG = 64


def say(text: str) -> None:
    print(f"rewind-pool: {text}", file=sys.stderr, flush=True)


@dataclass
class _Engine:
    pid: int
    pidfd: int
    conn: socket.socket | None  # the server's connection, while it is open


@dataclass
class Pool:
    """The listening socket, the connections waiting to be answered, the engines forked and not yet reaped."""

    path: str
    verbose: bool = False  # a line on stderr for each engine forked and each engine reaped
    listener: socket.socket = field(init=False)
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    engines: dict[int, _Engine] = field(default_factory=dict)  # by pidfd
    waiting: set[socket.socket] = field(default_factory=set)  # connections whose request has not come
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # Rewind's files as imported: size, mtime
    environment: dict[str, str] = field(default_factory=dict)  # the load-time part of the pool's
    stopping: bool = False

    def open(self) -> None:
        """Listen, then import: a path that cannot be used is said at once, and servers asking meanwhile wait
        for the import (their requests queue) rather than start engines of their own."""
        self.listener = listen(self.path)
        # deferred: torch and the engine, imported once here, after the socket's path is taken
        import dap_server.engine  # noqa: F401

        self.files = _project_files()
        self.environment = _load_time(os.environ)
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")

    def serve(self) -> None:
        while not (self.stopping and not self.engines):
            for key, _ in self.selector.select(timeout=0.5):
                try:
                    self._ready(key)
                except OSError as exc:  # one connection's trouble is that connection's
                    say(f"a request failed: {exc.strerror or exc}")
                except Exception as exc:  # noqa: BLE001  nor does anything else stop the pool serving the others
                    say(f"a request failed ({type(exc).__name__}: {exc}); serving on")
        self.selector.close()

    def stop(self) -> None:
        """Listen no more; serve until the engines forked have ended (a second call ends at once)."""
        if self.stopping:
            os._exit(0)
        self.stopping = True
        self.selector.unregister(self.listener)
        self.listener.close()
        _remove_socket(self.path)
        for conn in list(self.waiting):
            self._drop(conn)

    def _ready(self, key: selectors.SelectorKey) -> None:
        if key.data == "listener":
            conn, _ = self.listener.accept()
            if _peer_uid(conn) != os.getuid():
                conn.close()
                return
            conn.setblocking(False)
            self.waiting.add(conn)
            self.selector.register(conn, selectors.EVENT_READ, "request")
        elif key.data == "request":
            self._request(key.fileobj)
        else:
            self._reap(key.data)

    def _request(self, conn: socket.socket) -> None:
        try:
            data, fds, flags, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        try:
            if not data:
                return
            request = _checked(data, flags, fds)
            why = self._refusal(request)
            if why is not None:
                _send(conn, {"refused": why})
                return
            pid = self._fork(request, fds)
            pidfd = os.pidfd_open(pid)  # before anything can fail: the engine is reaped whatever happens next
            self.selector.unregister(conn)
            self.waiting.discard(conn)
            self.engines[pidfd] = _Engine(pid, pidfd, conn)
            self.selector.register(pidfd, selectors.EVENT_READ, pidfd)
            held, conn = conn, None
            if self.verbose:
                say(f"engine {pid} forked for a session in {request['cwd']}")
            try:
                _send(held, {"pid": pid}, [pidfd])
            except OSError:  # the server left before its answer: the engine reads the end of its stdin and ends
                self.engines[pidfd].conn = None
                held.close()
        except _Unreadable as why:
            _send(conn, {"refused": str(why)})
        finally:
            for fd in fds:
                os.close(fd)
            if conn is not None:
                self._drop(conn)

    def _refusal(self, request: dict) -> str | None:
        """Why this pool cannot fork the engine asked for; None when it can."""
        if request["root"] != ROOT:
            return f"it serves the Rewind in {ROOT}, and this server is the one in {request['root']}"
        if request["executable"] != sys.executable:
            return f"it runs {sys.executable}, and this server runs {request['executable']}"
        changed = _changed(self.files)
        if changed is not None:
            return f"{changed} has changed since the pool imported it: restart the pool"
        wanted = _load_time(request["env"])
        differing = sorted(k for k in set(wanted) | set(self.environment) if wanted.get(k) != self.environment.get(k))
        if differing:
            return (f"the engine's environment differs from the pool's in {', '.join(differing[:5])}"
                    f"{' ...' if len(differing) > 5 else ''}, which torch or Python read when they load")
        return None

    def _fork(self, request: dict, fds: list[int]) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._be_engine(request, fds)
        return pid

    def _be_engine(self, request: dict, fds: list[int]) -> None:
        """In the forked child: nothing of the pool kept, the server's descriptors as 0, 1 and 2, its environment
        and working directory, then the engine's main (which leaves the process itself)."""
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.setpgid(0, 0)  # a group of its own: Ctrl-C at the pool's terminal is the pool's, not its sessions'
            self.selector.close()
            self.listener.close()
            for conn in self.waiting:
                conn.close()
            for engine in self.engines.values():
                os.close(engine.pidfd)
                if engine.conn is not None:
                    engine.conn.close()
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3) for fd in fds]  # none of them in the way of another's dup2
            for fd in fds:
                os.close(fd)
            for target, fd in enumerate(high):
                os.dup2(fd, target)
            for fd in high:
                os.close(fd)
            os.environ.clear()
            os.environ.update(request["env"])
            tempfile.tempdir = None  # found again from this environment
            os.chdir(request["cwd"])
            _fresh_random()
            from dap_server import engine  # deferred: imported already by open(); named here, in the engine

            sys.argv = [engine.__file__, *request["argv"]]
            engine.main(request["argv"])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _reap(self, pidfd: int) -> None:
        engine = self.engines.pop(pidfd)
        self.selector.unregister(pidfd)
        _, status = os.waitpid(engine.pid, 0)
        os.close(pidfd)
        if self.verbose:
            say(f"engine {engine.pid} ended with exit code {os.waitstatus_to_exitcode(status)}")
        if engine.conn is not None:
            try:
                _send(engine.conn, {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:  # the server has gone: nobody to tell
                pass
            engine.conn.close()

    def _drop(self, conn: socket.socket) -> None:
        self.waiting.discard(conn)
        try:
            self.selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


class _Unreadable(Exception):
    """A request the pool does not take, in words."""


def _checked(data: bytes, flags: int, fds: list[int]) -> dict:
    """A request's fields, each checked (they come from whoever reached the socket)."""
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise _Unreadable(f"the request is longer than {MAX_MESSAGE} bytes or carries too many descriptors")
    if len(fds) != 3:
        raise _Unreadable(f"a request carries the engine's stdin, stdout and stderr; this one carries {len(fds)} "
                          "descriptors")
    try:
        request = json.loads(data)
    except ValueError:
        raise _Unreadable("the request is not JSON") from None
    if not isinstance(request, dict):
        raise _Unreadable("the request is not a JSON object")
    for name in ("cwd", "executable", "root"):
        if not isinstance(request.get(name), str) or "\0" in request[name]:
            raise _Unreadable(f"the request's '{name}' is not a path")
    env, argv = request.get("env"), request.get("argv")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) and "\0" not in k + v
                                            and "=" not in k and k for k, v in env.items()):
        raise _Unreadable("the request's 'env' is not an environment (names and values, strings)")
    if argv not in ([],) and not (isinstance(argv, list) and len(argv) == 2 and argv[0] == "--log-level"
                                  and argv[1] in _LOG_LEVELS):
        raise _Unreadable("the pool starts plain session engines ('--log-level LEVEL' at most)")
    if not os.path.isdir(request["cwd"]):
        raise _Unreadable(f"the working directory {request['cwd'][:200]} is not a folder")
    return request


def _send(conn: socket.socket, message: dict, fds: list[int] = ()) -> None:
    conn.setblocking(True)
    try:
        socket.send_fds(conn, [json.dumps(message).encode()], list(fds))
    finally:
        conn.setblocking(False)


def _load_time(env: dict[str, str]) -> dict[str, str]:
    read = LOAD_TIME + tuple(p for p, module in LOADED_LATER.items() if module in sys.modules)
    return {k: v for k, v in env.items() if k.startswith(read)}


def _project_files() -> dict[str, tuple[int, int]]:
    """The files of Rewind the pool has imported, with their size and modification time."""
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.startswith(ROOT + os.sep):
            try:
                st = os.stat(path)
            except OSError:
                continue
            found[path] = (st.st_size, st.st_mtime_ns)
    return found


def _changed(files: dict[str, tuple[int, int]]) -> str | None:
    """The first of Rewind's imported files that is not as it was imported (None when none is)."""
    for path, seen in files.items():
        try:
            st = os.stat(path)
        except OSError:
            return os.path.relpath(path, ROOT)
        if (st.st_size, st.st_mtime_ns) != seen:
            return os.path.relpath(path, ROOT)
    return None


def _fresh_random() -> None:
    """What a new interpreter seeds afresh and a fork would copy: torch's default generator and numpy's global one,
    from the system's randomness as a fresh process seeds them (Python's `random` reseeds itself after a fork)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[2]


def listen(path: str) -> socket.socket:
    """A SOCK_SEQPACKET socket listening at `path`, readable and writable by this user only. A socket left there by a
    pool that has ended is replaced; anything else there is an error saying so."""
    if len(os.fsencode(path)) >= 108:
        raise SystemExit(f"rewind pool: the socket path {path} is too long for a Unix socket (at most 107 bytes)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise SystemExit(f"rewind pool: {path} exists and is not a socket: give another --socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens there: a pool that ended without removing it
        else:
            probe.close()
            raise SystemExit(f"rewind pool: a pool already listens at {path}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(_BACKLOG)
    listener.setblocking(False)
    return listener


def _remove_socket(path: str) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass


def default_socket() -> str:
    """$XDG_RUNTIME_DIR/rewind/engines.sock, else a folder of this user's in the temporary folder."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(base) / "rewind" if base else Path(tempfile.gettempdir()) / f"rewind-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SystemExit(f"rewind pool: {folder} is not a private folder of this user's (it must be mode 700): "
                         "give --socket a path in one")
    return str(folder / "engines.sock")


def run(path: str, ready_fd: int | None = None, verbose: bool = False) -> None:
    """Open the pool at `path`, say so (on stdout, and by closing `ready_fd` when given), and serve until stopped."""
    pool = Pool(path, verbose)
    try:
        pool.open()
        signal.signal(signal.SIGTERM, lambda *_: pool.stop())
        signal.signal(signal.SIGINT, lambda *_: pool.stop())
        print(f"rewind pool: forking engines at {path}\n  export REWIND_ENGINE_POOL={path}", flush=True)
        if ready_fd is not None:
            os.close(ready_fd)
        pool.serve()
    except KeyboardInterrupt:  # while it imported: nothing was forked yet
        raise SystemExit(130) from None
    finally:
        if hasattr(pool, "listener") and not pool.stopping:  # its own socket, not one it found in use
            _remove_socket(path)
