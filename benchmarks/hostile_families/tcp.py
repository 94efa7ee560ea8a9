"""concurrent: hostile TCP clients beside a normal one, clients that leave mid-launch, and the front's memory.

Tries, on a TCP server with a 2 s handshake and frame timeout: idle clients, slowloris clients (one byte every
50 ms, in the handshake and in the middle of a frame) and clients that disconnect in the middle of a frame, one of
each kind at a time, while a normal client initializes, launches hostile.py build, configurationDone, continues;
clients that close their socket at a seeded moment while their launch loads; then the front process's RSS over
20 sequential sessions (each opening the recorded trace in a fresh engine), reported under the table.

Handled: the normal client's session runs to its end; each hostile client is closed by the server's timeouts
(hang: still connected 12 s later) and the server lives on; a client that leaves mid-launch has its engine end
within 30 s and the server serves a new client. Engines ending are expected here. Crash and leak as everywhere.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from pathlib import Path

from .common import HOSTILE, Crash, Family, Hang, Server, SetupError, Wire, body, framed, gone_within, goodbye, \
    initialize, launch_program, open_trace

TITLE = "concurrent TCP clients"
BUDGET_S = (150, 40)  # (default, --quick) seconds
TIMEOUT_S = 2.0  # the server's handshake and frame timeouts
KINDS = ["idle", "slowloris (handshake)", "slowloris (mid-frame)", "disconnect mid-frame"]
ROUNDS = 1


def trickle(wire: Wire, data: bytes, started: float, limit_s: float) -> None:
    """`data` a byte every 50 ms, until the server closes the connection or `limit_s` has passed."""
    for byte in data:
        if wire.ended is not None or time.monotonic() - started > limit_s:
            break
        try:
            wire.raw(bytes([byte]))
        except Crash:
            break
        time.sleep(0.05)


def adversary(kind: str, server: Server, limit_s: float, rng: random.Random) -> tuple[str, str | None, Wire]:
    """One hostile connection; (what it did, a failure or None, its wire)."""
    wire = server.connect(f"{kind}")
    init = framed(body("initialize", {"adapterID": "slow"}))
    started = time.monotonic()
    if kind == "slowloris (handshake)":
        trickle(wire, init * 4, started, limit_s)
    elif kind == "slowloris (mid-frame)":
        wire.raw(init)
        trickle(wire, framed(body("threads")) * 20, started, limit_s)
    elif kind == "disconnect mid-frame":
        blob = init + framed(body("threads"))
        wire.raw(blob[:rng.randrange(1, len(blob))])
        time.sleep(rng.uniform(0, 0.2))
        wire.close()
        return kind, None, wire
    if not wire.wait_closed(limit_s):
        wire.close()
        return kind, f"{kind}: still connected {limit_s:g} s later", wire
    wire.closing_ok = True
    return kind, None, wire


class Round:
    """The hostile clients, a thread a kind, attacking while a normal client debugs."""

    def __init__(self, fam: Family, server: Server, number: int):
        self.fam, self.server, self.number = fam, server, number
        self.per_kind = fam.n(8, 1)
        self.done = threading.Event()
        self.results: list[tuple[str, str | None, Wire | None]] = []
        self.lock = threading.Lock()
        self.repro = (f"TCP server with --handshake-timeout {TIMEOUT_S:g} --frame-timeout {TIMEOUT_S:g}: while idle, "
                      "slowloris (1 byte / 50 ms) and mid-frame-disconnecting clients connect (one of each at a "
                      "time), a normal client initializes, launches hostile.py build stopOnEntry, configurationDone, "
                      "continue")

    def attack(self, kind: str, seed: int) -> None:
        rng = random.Random(seed)
        for n in range(self.per_kind):
            if self.done.is_set() and n > 0:
                break
            try:
                result = adversary(kind, self.server, TIMEOUT_S + 10, rng)
            except (Crash, Hang) as exc:
                result = (kind, f"{kind}: {exc}", None)
            with self.lock:
                self.results.append(result)

    def run(self) -> None:
        threads = [threading.Thread(target=self.attack, args=(k, self.fam.rng.randrange(2**31)), daemon=True)
                   for k in KINDS]
        for t in threads:
            t.start()
        self.normal_client()
        self.done.set()
        for t in threads:
            t.join(timeout=self.per_kind * (TIMEOUT_S + 15))
        for kind, failure, wire in self.results:
            self.judge(kind, failure, wire)

    def normal_client(self) -> None:
        with self.fam.check(f"round {self.number}: the normal client beside them", self.repro) as chk:
            started = time.monotonic()
            wire = self.server.connect("normal")
            initialize(chk, wire)
            launch_program(chk, wire, HOSTILE, stop_on_entry=True)
            stop = chk.motion(wire, "continue")
            chk.expect(stop is not None and stop.get("body", {}).get("reason") == "end",
                       "continue did not reach the end")
            chk.threads(wire)
            goodbye(wire)
            self.fam.notes.append(f"round {self.number}: the normal client's session took "
                                  f"{time.monotonic() - started:.1f} s beside the hostile clients")

    def judge(self, kind: str, failure: str | None, wire: Wire | None) -> None:
        """One hostile client as an input: what it got back is searched for leaks too."""
        with self.fam.check(f"round {self.number}: {kind}", self.repro.split(":")[0] + f": one {kind} client") as chk:
            if wire is not None:
                chk.marks[wire] = 0
                chk.sent.append(json.dumps(body("initialize", {"adapterID": "slow"}).decode()))
            if failure:
                raise Hang(failure) if "still connected" in failure else Crash(failure)
            chk.expect(self.server.alive(), "the server is gone")


def client_leaves(fam: Family, server: Server) -> None:
    """A client that leaves while its launch is loading: its engine must go."""
    delay = fam.rng.uniform(0.1, 1.5)
    with fam.check(f"a client leaves {delay:.2f} s into its launch",
                   f"TCP server: initialize, launch hostile.py build, close the socket {delay:.2f} s later; "
                   "the engine must end, the server serve a new client") as chk:
        wire = server.connect()
        initialize(chk, wire)
        chk.send(wire, "launch", {"program": str(HOSTILE), "driver": "torch:cpu"})
        engines = server.engines()
        time.sleep(delay)
        wire.close()
        left = gone_within(engines, 30)
        if left:
            raise Hang(f"engine {left} still running 30 s after its client left")
        other = server.connect()
        initialize(chk, other)
        chk.threads(other)
        goodbye(other)


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def rss_session(fam: Family, server: Server, trace: Path | None, i: int) -> None:
    """One session of the RSS run: the recorded trace (else hostile.py build) opened, moved, looked at, left."""
    with fam.check(f"session {i} of the RSS run", "TCP server: initialize, launch (the recorded trace, else "
                   "hostile.py build), configurationDone, continue, stepBack, evaluate, disconnect",
                   counted=False) as chk:
        wire = server.connect()
        initialize(chk, wire)
        if trace is not None:
            if not open_trace(chk, wire, trace):
                raise SetupError("the trace did not open")
        else:
            launch_program(chk, wire, HOSTILE, stop_on_entry=True)
        chk.motion(wire, "continue")
        chk.motion(wire, "stepBack")
        chk.request(wire, "evaluate", {"expression": "x", "context": "repl"})
        goodbye(wire)
        gone_within(server.engines(), 10)


def front_rss(fam: Family) -> None:
    """The front's memory over sequential sessions, after one warm-up session."""
    ctx = fam.ctx
    server = fam.tcp_server("RSS server")
    if server is None:
        return
    trace = ctx.base_trace if ctx.base_trace is not None and ctx.base_trace.exists() else None
    rss_session(fam, server, trace, 0)
    before = rss_mib(server.process.pid)
    done_sessions = 0
    for i in range(1, fam.n(20, 2) + 1):
        if fam.out_of_time():
            continue
        rss_session(fam, server, trace, i)
        done_sessions += 1
    after = rss_mib(server.process.pid) if server.alive() else math.nan
    ctx.rss_line = (f"adapter RSS over {done_sessions} sessions: {before:.1f} MiB -> {after:.1f} MiB "
                    f"(the front process, after one warm-up session; each session opens "
                    f"{'the recorded trace' if trace else 'hostile.py'} in a fresh engine)")
    server.stop()


def run(fam: Family) -> None:
    fam.engine_deaths_expected = True
    server = fam.tcp_server("server", "--handshake-timeout", str(TIMEOUT_S), "--frame-timeout", str(TIMEOUT_S))
    if server is None:
        return
    for number in range(ROUNDS):
        if not fam.out_of_time():
            Round(fam, server, number).run()
    for _ in range(fam.n(2, 0)):
        if not fam.out_of_time():
            client_leaves(fam, server)
    server.stop()
    front_rss(fam)
