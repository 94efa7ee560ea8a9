"""What the hostile-input families share: the sandbox, the servers and connections, and one input's verdict.

An input is one `Check`: the requests and raw bytes it sends, watched on every connection it touches. On leaving
its `with` block it is judged: a `Crash` (the server exited, a connection died) or a `Hang` (no answer within the
timeout) raised inside it is recorded; every request still unanswered is waited for; every message that came back
is searched for a leak (`LEAK`: a Python exception class, "internal error" or "Traceback" the input did not
contain); a marker file that appeared means code was executed. It is handled when nothing of that happened and
every refusal came with a message.
"""

from __future__ import annotations

import argparse
import builtins
import collections
import contextlib
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "models" / "hostile.py"
MARKER_MODULE = "rewind_marker_mod"
NO_ARGS = object()
INITIALIZE = {"adapterID": "rewind", "clientID": "hostile-bench", "linesStartAt1": True, "columnsStartAt1": True,
              "pathFormat": "path", "supportsProgressReporting": True, "supportsInvalidatedEvent": True,
              "supportsMemoryEvent": True}

# -- what counts as a leak ----------------------------------------------------------------------------------
EXCEPTION_NAMES = sorted({n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
                         | {"LZ4BlockError", "JSONDecodeError", "ValidationError", "UnpicklingError", "PicklingError",
                            "ExtraData", "FormatError", "StackError", "UnpackValueError", "UnpackException",
                            "BufferFull", "OutOfData", "BadZipFile", "CancelledError", "InvalidStateError",
                            "IncompleteReadError", "LimitOverrunError", "ArgumentError", "ParserError",
                            "UnicodeDecodeError", "TraceError", "RewindError", "ExpressionError", "FileWriteError",
                            "TargetExists", "ChannelError", "ArgumentsError", "DapError", "FramingError"},
                         key=len, reverse=True)
LEAK = re.compile(r"\b(?:%s)\b|\bstruct\.error\b|\binternal error\b|\bTraceback\b"
                  % "|".join(re.escape(n) for n in EXCEPTION_NAMES), re.IGNORECASE)
LEAK_CASED = re.compile(r"\b(?:%s)\b|\bstruct\.error\b" % "|".join(re.escape(n) for n in EXCEPTION_NAMES))


def leak_texts(message: dict) -> list[str]:
    """The parts of a message a user reads as what the server says of its own."""
    if not isinstance(message, dict):
        return [repr(message)]
    body = message.get("body") if isinstance(message.get("body"), dict) else {}
    if message.get("type") == "response":
        texts = [message["message"]] if isinstance(message.get("message"), str) else []
        if not message.get("success"):
            texts.append(json.dumps(message.get("body"), ensure_ascii=False))
        return texts
    event = message.get("event")
    if event == "output":
        return [str(body.get("output", ""))]
    if event == "stopped":
        return [str(body.get("description", "")), str(body.get("text", ""))]
    if event in ("progressStart", "progressUpdate", "progressEnd"):
        return [str(body.get("title", "")), str(body.get("message", ""))]
    return []


def find_leaks(messages: Iterable[dict], sent: str) -> list[str]:
    found = []
    for message in messages:
        for text in leak_texts(message):
            for match in LEAK.finditer(text):
                word = match.group(0)
                if match.re is LEAK and not (LEAK_CASED.fullmatch(word) or word.lower() in ("internal error",
                                                                                          "traceback")):
                    continue  # a lower-case English word ("error"), not a class name
                if re.search(r"\b%s\b" % re.escape(word), sent):
                    continue  # the input itself said it: an echo, not a leak
                at = max(0, match.start() - 100)
                name = message.get("command") or message.get("event")
                found.append(f"{name}: …{text[at:match.end() + 100]}…")
                break
    return found


# -- the run's settings, sandbox and processes ----------------------------------------------------------------
class Ctx:
    def __init__(self, args: argparse.Namespace):
        self.seed, self.quick, self.timeout, self.keep = args.seed, args.quick, args.timeout, args.keep
        self.verbose = args.verbose
        self.sandbox = Path(tempfile.mkdtemp(prefix="rewind-hostile-bench-"))
        self.markers = self.sandbox / "markers"
        self.markers.mkdir()
        (self.sandbox / "tmp").mkdir()
        (self.sandbox / "cache").mkdir()
        (self.sandbox / "a-file.txt").write_text("not a model, not a trace\n")
        (self.sandbox / "a-folder").mkdir()
        (self.sandbox / f"{MARKER_MODULE}.py").write_text(
            "import os\n"
            f"open(os.path.join({str(self.markers)!r}, 'module-imported-' + str(os.getpid())), 'w').close()\n"
            "def __getattr__(name):\n    return lambda *a, **k: None\n")
        self.marker_so = self._marker_library()
        self.env = {k: v for k, v in os.environ.items() if k not in ("REWIND_TOKEN", "PYTHONSTARTUP")}
        self.env.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", TMPDIR=str(self.sandbox / "tmp"),
                        XDG_CACHE_HOME=str(self.sandbox / "cache"), REWIND_KNOWLEDGE=str(self.sandbox / "fixes.json"),
                        HOME=str(self.sandbox))
        self.servers: list[Server] = []
        self.engine_pids: set[int] = set()
        self.rss_line: str | None = None
        self.base_trace: Path | None = None

    def _marker_library(self) -> str | None:
        """A shared library whose constructor writes a marker file (for load_library payloads); None without cc."""
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            return None
        source = self.sandbox / "marker.c"
        source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void hit(void) {\n'
                          f'  FILE *f = fopen("{self.markers}/library-loaded", "w"); if (f) fclose(f);\n}}\n')
        out = self.sandbox / "libmarker.so"
        done = subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(source)], capture_output=True)
        return str(out) if done.returncode == 0 else None

    def markers_hit(self) -> list[str]:
        names = sorted(os.listdir(self.markers))
        for name in names:
            path = self.markers / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        return names

    def cleanup(self) -> None:
        for server in self.servers:
            server.stop()
        for pid in sorted(self.engine_pids):
            kill_engine(pid)
        if not self.keep:
            shutil.rmtree(self.sandbox, ignore_errors=True)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [c for c in found if alive(c)]


def is_engine(pid: int) -> bool:
    try:
        return b"dap_server.engine" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill_engine(pid: int) -> None:
    """SIGKILL an engine this run's servers started (checked by its command line: pids are reused)."""
    if alive(pid) and is_engine(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def gone_within(pids: Iterable[int], timeout: float) -> list[int]:
    """The processes of `pids` still running after each was given up to `timeout` seconds to end."""
    return [pid for pid in pids if not wait_until(lambda: not alive(pid), timeout)]


def preview(value: Any, limit: int = 300) -> str:
    """A value as the repro shows it: JSON (or bytes' repr), cut with its full size."""
    if isinstance(value, (bytes, bytearray)):
        text = repr(bytes(value))
    else:
        try:
            text = json.dumps(value, ensure_ascii=True)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


# -- inputs built by hand ---------------------------------------------------------------------------------------
_RAW_SEQ = iter(range(1_000_000, 10**9))


def body(command: str = "threads", arguments: Any = NO_ARGS, seq: int | None = None) -> bytes:
    """A request's JSON bytes; the seqs of the run's hand-built requests count up from one counter."""
    message = {"seq": next(_RAW_SEQ) if seq is None else seq, "type": "request", "command": command}
    if arguments is not NO_ARGS:
        message["arguments"] = arguments
    return json.dumps(message).encode()


def framed(data: bytes, length: int | None = None, header: bytes = b"Content-Length") -> bytes:
    return header + b": %d\r\n\r\n" % (len(data) if length is None else length) + data


def random_json(rng: random.Random, depth: int) -> Any:
    leaves = [None, True, False, 0, -1, 2**31, 10**12, 2**63, 1.5, float("inf"), "", "x", "\x00", "é🙂\u202e",
              "a" * 1000]
    if depth <= 0 or rng.random() < 0.4:
        return rng.choice(leaves)
    if rng.random() < 0.5:
        return [random_json(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "expression", "frameId", "", "seq"]): random_json(rng, depth - 1)
            for _ in range(rng.randint(0, 3))}


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


# -- a DAP connection ---------------------------------------------------------------------------------------------
class Crash(Exception):
    """The server process exited, or a connection died when it should not have."""


class Hang(Exception):
    """No answer within the timeout."""


class SetupError(Exception):
    """The benchmark could not put the server in the state an input needs."""


class Wire:
    """One DAP connection to a server: requests and raw bytes out; every message in, read by a thread."""

    def __init__(self, label: str, reader: Any, write: Callable[[bytes], None], close: Callable[[], None],
                 server: "Server"):
        self.label, self._reader, self._write, self._close, self.server = label, reader, write, close, server
        self.messages: list[dict] = []
        self.responses: dict[int, dict] = {}
        self.cond = threading.Condition()
        self.ended: str | None = None  # why the stream from the server ended
        self.closing_ok = False  # set when the input means the connection to close
        self.seq = 5_000_000  # far from the seqs that hand-written and raw frames carry
        self.sent_seqs: set[int] = set()  # a response counts only for a request this client sent
        self._send_lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True, name=f"wire-{label}").start()

    def _pump(self) -> None:
        why = "the server closed the connection"
        try:
            while True:
                self._received(self._read_message())
        except EOFError:
            pass
        except (OSError, ValueError) as exc:
            why = f"unreadable output from the server ({exc})"
        with self.cond:
            self.ended = why
            self.cond.notify_all()

    def _read_message(self) -> Any:
        """The next message from the server (EOFError at the end of the stream)."""
        length = None
        while True:
            line = self._reader.readline(65536)
            if not line:
                raise EOFError
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        if length is None:
            raise ValueError(f"a header block without Content-Length from the server: {line!r}")
        body = self._reader.read(length)
        if len(body) < length:
            raise EOFError
        return json.loads(body)

    def _received(self, message: Any) -> None:
        with self.cond:
            self.messages.append(message)
            if isinstance(message, dict) and message.get("type") == "response" \
                    and message.get("request_seq") in self.sent_seqs:
                self.responses.setdefault(message.get("request_seq"), message)
            self.cond.notify_all()

    # -- out
    def _put(self, data: bytes) -> None:
        try:
            with self._send_lock:
                self._write(data)
        except (OSError, ValueError) as exc:
            raise Crash(f"{self.label}: writing to the server failed ({exc}){self.server.why_gone()}") from None

    def send(self, command: Any, arguments: Any = NO_ARGS, seq: int | None = None) -> tuple[int, str]:
        with self._send_lock:
            if seq is None:
                self.seq += 1
                seq = self.seq
        with self.cond:
            self.sent_seqs.add(seq)
        message = {"seq": seq, "type": "request", "command": command}
        if arguments is not NO_ARGS:
            message["arguments"] = arguments
        text = json.dumps(message)
        body = text.encode("utf-8", "surrogatepass")
        self._put(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return seq, text

    def raw(self, data: bytes) -> None:
        self._put(data)

    # -- in
    def mark(self) -> int:
        with self.cond:
            return len(self.messages)

    def since(self, mark: int) -> list[dict]:
        with self.cond:
            return list(self.messages[mark:])

    def _gone(self, what: str) -> Crash:
        return Crash(f"{self.label}: {self.ended} while waiting for {what}{self.server.why_gone()}")

    def wait_response(self, seq: int, timeout: float, what: str = "") -> dict:
        with self.cond:
            if not self.cond.wait_for(lambda: seq in self.responses or self.ended is not None, timeout):
                raise Hang(f"{self.label}: no answer to {what or seq} within {timeout:g} s")
            if seq in self.responses:
                return self.responses[seq]
            raise self._gone(f"the answer to {what or seq}")

    def wait_event(self, names: tuple[str, ...], after: int, timeout: float,
                   predicate: Callable[[dict], bool] | None = None) -> dict:
        def find() -> dict | None:
            for message in self.messages[after:]:
                if message.get("type") == "event" and message.get("event") in names and (
                        predicate is None or predicate(message.get("body") or {})):
                    return message
            return None

        with self.cond:
            if not self.cond.wait_for(lambda: find() is not None or self.ended is not None, timeout):
                raise Hang(f"{self.label}: no {'/'.join(names)} event within {timeout:g} s")
            found = find()
            if found is None:
                raise self._gone(f"a {'/'.join(names)} event")
            return found

    def wait_closed(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.ended is not None, timeout)

    def close(self) -> None:
        self.closing_ok = True
        try:
            self._close()
        except OSError:
            pass


class Server:
    """`python -m dap_server` in a child process: stdio (`wire`) or TCP on 127.0.0.1 (`connect()`)."""

    def __init__(self, ctx: Ctx, *args: str, tcp: bool = False, label: str = ""):
        self.ctx, self.tcp, self.label = ctx, tcp, label or ("tcp" if tcp else "stdio")
        self.args = [*args, *(["--port", "0", "--host", "127.0.0.1"] if tcp else [])]
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._port: queue.Queue = queue.Queue()
        self.process = subprocess.Popen([sys.executable, "-m", "dap_server", *self.args], cwd=ctx.sandbox,
                                        env=ctx.env, stdin=subprocess.DEVNULL if tcp else subprocess.PIPE,
                                        stdout=subprocess.DEVNULL if tcp else subprocess.PIPE,
                                        stderr=subprocess.PIPE)
        ctx.servers.append(self)
        threading.Thread(target=self._drain, daemon=True).start()
        self.wire: Wire | None = None
        self.port = 0
        if tcp:
            self.port = self._listening_port()
        else:
            self.wire = Wire(self.label, self.process.stdout, self._write_stdin, self.process.stdin.close, self)

    def _listening_port(self) -> int:
        try:
            return self._port.get(timeout=60)
        except queue.Empty:
            self.stop()
            raise SetupError(f"the TCP server did not say where it listens: {list(self.stderr_tail)}") from None

    def _write_stdin(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def _drain(self) -> None:
        for raw in self.process.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.stderr_tail.append(line)
            match = re.search(r"listening on [\d.]+:(\d+)", line)
            if match:
                self._port.put(int(match[1]))

    def connect(self, label: str = "") -> Wire:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except OSError as exc:
            raise Crash(f"cannot connect to the TCP server ({exc}){self.why_gone()}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)

        def close() -> None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

        return Wire(label or f"tcp:{self.port}", sock.makefile("rb"), sock.sendall, close, self)

    def alive(self) -> bool:
        return self.process.poll() is None

    def why_gone(self) -> str:
        if self.process.poll() is None:
            return ""
        tail = " | ".join(line for line in list(self.stderr_tail)[-4:] if line.strip())
        return f" (the server process exited with status {self.process.returncode}; its stderr ends: {tail[:400]})"

    def engines(self) -> list[int]:
        found = [pid for pid in children(self.process.pid) if is_engine(pid)]
        self.ctx.engine_pids.update(found)
        return found

    def stop(self) -> None:
        engines = self.engines() if self.alive() else []
        if self.wire is not None:
            self.wire.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in engines:
            if alive(pid) and not wait_until(lambda: not alive(pid), 5):
                kill_engine(pid)


def goodbye(wire: Wire, timeout: float = 10) -> None:
    """disconnect, then close (never fails: the connection may be gone already)."""
    wire.closing_ok = True
    try:
        if wire.ended is None:
            seq, _ = wire.send("disconnect", {})
            wire.wait_response(seq, timeout, "disconnect")
    except (Crash, Hang):
        pass
    wire.close()


# -- one input, and the tally of a family -----------------------------------------------------------------------
@dataclass
class Outcome:
    label: str
    repro: str
    crash: str | None = None
    hang: str | None = None
    leaks: list[str] = field(default_factory=list)
    executed: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # unclear errors, unmet expectations

    @property
    def handled(self) -> bool:
        return not (self.crash or self.hang or self.leaks or self.executed or self.lost or self.problems)

    @property
    def broke(self) -> bool:
        """The input crashed or hung its server: the next one needs a fresh connection."""
        return bool(self.crash or self.hang)

    def kinds(self) -> list[str]:
        return [k for k, v in (("crash", self.crash), ("hang", self.hang), ("leak", self.leaks),
                               ("code executed", self.executed), ("file lost", self.lost),
                               ("not handled", self.problems)) if v]

    def detail(self) -> str:
        parts = [self.crash, self.hang, *self.leaks, *self.executed, *self.lost, *self.problems]
        return "; ".join(p for p in parts if p)


COUNTS = ("tried", "handled", "crashes", "hangs", "leaks", "executed", "lost")  # a Tally's columns, in order


@dataclass
class Tally:
    title: str
    tried: int = 0
    handled: int = 0
    crashes: int = 0
    hangs: int = 0
    leaks: int = 0
    executed: int = 0
    lost: int = 0
    failures: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.tried += 1
        self.handled += outcome.handled
        self.crashes += bool(outcome.crash)
        self.hangs += bool(outcome.hang)
        self.leaks += bool(outcome.leaks)
        self.executed += bool(outcome.executed)
        self.lost += bool(outcome.lost)
        if not outcome.handled:
            self.failures.append(outcome)


class Check:
    """One input: the requests it sends, what comes back on the connections it watches, and its verdict."""

    def __init__(self, family: "Family", label: str, repro: str, counted: bool = True):
        self.family, self.ctx, self.counted = family, family.ctx, counted
        self.outcome = Outcome(label, repro)
        self.timeout = family.ctx.timeout
        self.marks: dict[Wire, int] = {}
        self.sent: list[str] = []
        self.pending: list[tuple[Wire, int, str]] = []

    def __enter__(self) -> "Check":
        self.ctx.markers_hit()  # a marker from before this input is not this input's
        self.began = time.monotonic()
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None and not issubclass(kind, Exception):
            return False  # KeyboardInterrupt and the like
        self._failed(kind, exc, tb)
        if not self.outcome.broke:
            self._unanswered()
        self._look_for_harm()
        if self.counted or not self.outcome.handled:
            self.family.tally.add(self.outcome)
        if self.ctx.verbose:
            verdict_text = "ok  " if self.outcome.handled else "FAIL"
            print(f"[hostile]   {time.monotonic() - self.began:6.2f} s  {verdict_text} {self.outcome.label[:100]}",
                  file=sys.stderr, flush=True)
        return True

    def _failed(self, kind, exc, tb) -> None:
        """What an exception out of the input means."""
        o = self.outcome
        if kind is Crash:
            o.crash = str(exc)
        elif kind is Hang:
            o.hang = str(exc)
        elif kind is SetupError:
            o.problems.append(f"setup: {exc}")
        elif kind is not None:
            o.problems.append(f"benchmark error: {kind.__name__}: {exc}")
            traceback.print_exception(kind, exc, tb, file=sys.stderr)

    def _look_for_harm(self) -> None:
        """Leaks in what came back, markers that appeared; an engine that ended unasked is noted."""
        o = self.outcome
        sent = "\n".join(self.sent)
        for wire, mark in self.marks.items():
            o.leaks += find_leaks(wire.since(mark), sent)
        for name in self.ctx.markers_hit():
            o.executed.append(f"marker '{name}' appeared")
        if self.family.engine_deaths_expected or o.broke:
            return
        for wire, mark in self.marks.items():
            for message in wire.since(mark):
                text = " ".join(leak_texts(message))
                if "engine ended" in text:
                    self.family.notes.append(f"{o.label}: {text.strip()[:300]}")
                    break

    def _unanswered(self) -> None:
        deadline = time.monotonic() + self.timeout
        for wire, seq, command in self.pending:
            if seq in wire.responses or wire.closing_ok:
                continue
            try:
                self.judge(wire.wait_response(seq, max(0.1, deadline - time.monotonic()), command))
            except Hang as exc:
                self.outcome.hang = str(exc)
                return
            except Crash as exc:
                self.outcome.crash = str(exc)
                return

    def watch(self, wire: Wire) -> Wire:
        self.marks.setdefault(wire, wire.mark())
        return wire

    def send(self, wire: Wire, command: Any, arguments: Any = NO_ARGS) -> int:
        self.watch(wire)
        seq, text = wire.send(command, arguments)
        self.sent.append(text)
        self.pending.append((wire, seq, str(command)))
        return seq

    def raw(self, wire: Wire, data: bytes) -> None:
        self.watch(wire)
        self.sent.append(data.decode("utf-8", "replace"))
        wire.raw(data)

    def judge(self, response: dict) -> dict:
        if not response.get("success"):
            message = response.get("message")
            if not (isinstance(message, str) and message.strip()):
                self.outcome.problems.append(f"'{response.get('command')}' refused without a message: "
                                             f"{preview(response, 200)}")
        return response

    def wait(self, wire: Wire, seq: int, timeout: float | None = None, what: str = "") -> dict:
        return self.judge(wire.wait_response(seq, timeout or self.timeout, what or str(seq)))

    def request(self, wire: Wire, command: Any, arguments: Any = NO_ARGS, timeout: float | None = None) -> dict:
        return self.wait(wire, self.send(wire, command, arguments), timeout, str(command))

    def threads(self, wire: Wire) -> None:
        """`threads` must be answered; refused (an engine that just died may take a request with it), it is
        asked once more a second later, and a second refusal is a failure."""
        response = self.request(wire, "threads")
        if response.get("success"):
            return
        first = response.get("message")
        time.sleep(1)
        response = self.request(wire, "threads")
        if response.get("success"):
            self.family.notes.append(f"{self.outcome.label}: threads was refused once ({first}), then answered")
        else:
            self.outcome.problems.append(f"threads refused twice: {response.get('message')}")

    def motion(self, wire: Wire, command: str, arguments: Any = NO_ARGS) -> dict | None:
        """A request that moves; its stopped (or terminated) event, or None when it was refused."""
        mark = wire.mark()
        response = self.request(wire, command, {"threadId": 1} if arguments is NO_ARGS else arguments)
        if not response.get("success"):
            return None
        return wire.wait_event(("stopped", "terminated"), mark, self.timeout)

    def expect(self, condition: bool, what: str) -> None:
        if not condition:
            self.outcome.problems.append(what)


class Family:
    """One family's run: its seeded random source, its time budget, its tally and the notes under the table."""

    def __init__(self, ctx: Ctx, key: str, title: str, budget_s: tuple[float, float]):
        self.ctx, self.key = ctx, key
        self.tally = Tally(title)
        self.rng = random.Random(f"{ctx.seed}:{key}")
        self.deadline = time.monotonic() + budget_s[1 if ctx.quick else 0]
        self.notes: list[str] = []
        self.engine_deaths_expected = False
        self.cut_short = 0  # inputs left out when the time budget ran out

    def time_left(self) -> bool:
        return time.monotonic() < self.deadline

    def out_of_time(self) -> bool:
        """The time budget ran out: the input at hand is left out (and counted as such)."""
        if self.time_left():
            return False
        self.cut_short += 1
        return True

    def check(self, label: str, repro: str, counted: bool = True) -> Check:
        return Check(self, label, repro, counted)

    @contextlib.contextmanager
    def setup(self, label: str, repro: str) -> Iterator[Check]:
        """An uncounted input that puts a server in the state the next inputs need; SetupError when it fails."""
        with self.check(label, repro, counted=False) as chk:
            yield chk
        if not chk.outcome.handled:
            raise SetupError(chk.outcome.detail())

    def n(self, default: int, quick: int) -> int:
        return quick if self.ctx.quick else default

    def setup_failed(self, what: str, exc: BaseException | str) -> None:
        self.notes.append(f"setup failed ({what}): {exc if isinstance(exc, str) else f'{type(exc).__name__}: {exc}'}")

    def tcp_server(self, what: str, *args: str) -> Server | None:
        """A TCP server for the family; None (noted) when it does not start."""
        try:
            return Server(self.ctx, *args, tcp=True)
        except SetupError as exc:
            self.setup_failed(what, exc)
            return None


class StdioSession:
    """A stdio server (--stop-grace 2) initialized and, when `launched`, stopped on entry of hostile.py build;
    replaced by a fresh one when an input crashes or hangs it."""

    def __init__(self, fam: Family, label: str, repro: str, launched: bool):
        self.fam, self.label, self.repro, self.launched = fam, label, repro, launched
        self.server: Server | None = None
        self.wire: Wire | None = None

    def renew(self, what: str) -> bool:
        """A fresh server in the state; False (noted as a setup failure of `what`) when it cannot be had."""
        try:
            self.close()
            self.server = Server(self.fam.ctx, "--stop-grace", "2")
            self.wire = self.server.wire
            with self.fam.setup(self.label, self.repro) as chk:
                initialize(chk, self.wire)
                if self.launched:
                    launch_program(chk, self.wire, HOSTILE, stop_on_entry=True)
        except (Crash, Hang, SetupError) as exc:
            self.fam.setup_failed(what, exc)
            return False
        return True

    def close(self) -> None:
        if self.wire is not None:
            goodbye(self.wire)
        if self.server is not None:
            self.server.stop()


def launch_program(chk: Check, wire: Wire, program: Path | str, entry: str = "build", stop_on_entry: bool = True,
                   **launch: Any) -> dict:
    """launch, configurationDone: the first stop (raises SetupError when the program does not start)."""
    mark = wire.mark()
    response = chk.request(wire, "launch", {"program": str(program), "entry": entry, "driver": "torch:cpu",
                                            "stopOnEntry": stop_on_entry, **launch})
    if not response.get("success"):
        raise SetupError(f"launch {program} refused: {response.get('message')}")
    wire.wait_event(("initialized",), mark, chk.timeout)
    stop = chk.motion(wire, "configurationDone", {})
    if stop is None:
        raise SetupError("configurationDone refused")
    return stop


def open_trace(chk: Check, wire: Wire, trace: Path) -> bool:
    """launch {trace}, then configurationDone; False when the launch is refused."""
    mark = wire.mark()
    if not chk.request(wire, "launch", {"trace": str(trace)}).get("success"):
        return False
    wire.wait_event(("initialized",), mark, chk.timeout)
    chk.motion(wire, "configurationDone", {})
    return True


def initialize(chk: Check, wire: Wire) -> None:
    response = chk.request(wire, "initialize", INITIALIZE)
    if not response.get("success"):
        raise SetupError(f"initialize refused: {response.get('message')}")
