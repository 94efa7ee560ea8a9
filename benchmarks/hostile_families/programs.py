"""programs: each hostile build() of tests/models/hostile.py launched over stdio and over TCP.

The builds call exit(), raise KeyboardInterrupt, call os._exit(), segfault, print without end (chatty), or never
return (sleeping forever, or spinning); those that never return are stopped 0.5 s into the launch by a pause, a
cancel of the launch, or a disconnect. After each, `threads` is asked and the well-behaved `build` entry is
launched and run to its end (on a new connection after a disconnect).

Handled: the launch of a build that dies or never returns is refused with a message (the chatty one succeeds and
at most 1 MiB of its output reaches the client), `threads` is answered, the server lives on and runs `build`;
after a disconnect the connection closes, a stdio server exits with status 0 and the hung engine ends within
15 s. Engines ending are expected here. Crash, hang and leak as everywhere.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from .common import HOSTILE, Check, Family, Hang, Server, Wire, gone_within, goodbye, initialize, launch_program

TITLE = "hostile programs (stdio + TCP)"
BUDGET_S = (200, 45)  # (default, --quick) seconds


@dataclass
class Hostile:
    entry: str
    stop: str | None = None  # pause, cancel or disconnect, for the builds that never return
    succeeds: bool = False  # the launch itself succeeds (chatty)

    @property
    def label(self) -> str:
        return self.entry + (f" + {self.stop}" if self.stop else "")


HOSTILES = [Hostile("build_exit"), Hostile("build_interrupt"), Hostile("build_os_exit"), Hostile("build_segfault"),
            Hostile("build_chatty", succeeds=True), Hostile("build_forever", "pause"),
            Hostile("build_forever", "disconnect"), Hostile("build_spin", "pause"), Hostile("build_spin", "cancel"),
            Hostile("build_spin", "disconnect")]


def good_launch(chk: Check, wire: Wire) -> None:
    """The front keeps serving: the well-behaved entry launches and runs to its end."""
    stop = launch_program(chk, wire, HOSTILE, stop_on_entry=False)
    chk.expect(stop.get("body", {}).get("reason") == "end", f"launch of build then stopped with {stop.get('body')}")


class Servers:
    """A fresh stdio server for every input, or the one TCP server (started again when it is gone)."""

    def __init__(self, fam: Family):
        self.fam = fam
        self.tcp: Server | None = None

    def open(self, transport: str) -> tuple[Server, Wire]:
        if transport == "tcp":
            if self.tcp is None or not self.tcp.alive():
                self.tcp = Server(self.fam.ctx, "--stop-grace", "1", tcp=True)
            return self.tcp, self.tcp.connect()
        server = Server(self.fam.ctx, "--stop-grace", "1")
        return server, server.wire

    def reopen(self, server: Server, wire: Wire, transport: str) -> tuple[Server, Wire]:
        """After goodbye: a new stdio server, or a new connection to the same TCP server."""
        goodbye(wire)
        if transport == "tcp":
            return server, server.connect()
        server.stop()
        server = Server(self.fam.ctx, "--stop-grace", "1")
        return server, server.wire

    def close(self) -> None:
        if self.tcp is None:
            return
        was_alive = self.tcp.alive()
        self.tcp.stop()
        if not was_alive:
            self.fam.notes.append("the TCP server was gone at the end")


def run(fam: Family) -> None:
    fam.engine_deaths_expected = True
    plan = [(h, t) for h in HOSTILES for t in ("stdio", "tcp")]
    if fam.ctx.quick:
        plan = [(HOSTILES[2], "stdio"), (HOSTILES[6], "tcp")]
    servers = Servers(fam)
    for hostile, transport in plan:
        if fam.out_of_time():
            continue
        repro = (f"{transport} server with --stop-grace 1: initialize; launch tests/models/hostile.py entry "
                 f"{hostile.entry}" + (f"; 0.5 s later {hostile.stop}" if hostile.stop else "")
                 + "; threads; then launch entry build (on a new connection after a disconnect) and run it")
        with fam.check(f"{transport}: {hostile.label}", repro) as chk:
            launch_hostile(chk, servers, hostile, transport)
    servers.close()


def launch_hostile(chk: Check, servers: Servers, hostile: Hostile, transport: str) -> None:
    server, wire = servers.open(transport)
    initialize(chk, wire)
    mark = wire.mark()
    loading = chk.send(wire, "launch", {"program": str(HOSTILE), "entry": hostile.entry, "driver": "torch:cpu"})
    if hostile.stop:
        if not stop_build(chk, server, wire, hostile, transport, loading, mark):
            return  # disconnected: nothing more on this connection
    else:
        server, wire = build_ended(chk, servers, server, wire, hostile, transport, loading, mark)
    good_launch(chk, wire)
    chk.expect(server.alive(), "the server is gone")
    goodbye(wire)
    if transport == "stdio":
        server.stop()


def stop_build(chk: Check, server: Server, wire: Wire, hostile: Hostile, transport: str, loading: int,
               mark: int) -> bool:
    """A build that never returns, stopped 0.5 s into its launch; False when it was stopped by a disconnect."""
    time.sleep(0.5)
    engines = server.engines()
    stop_args = {"threadId": 1} if hostile.stop == "pause" else {"requestId": loading} \
        if hostile.stop == "cancel" else {}
    chk.request(wire, hostile.stop, stop_args)
    response = chk.wait(wire, loading, what="launch")
    chk.expect(not response.get("success"), "the launch of a build that never returns succeeded")
    if hostile.stop == "disconnect":
        after_disconnect(chk, server, wire, transport, engines)
        return False
    wire.wait_event(("terminated",), mark, chk.timeout)
    chk.threads(wire)
    return True


def after_disconnect(chk: Check, server: Server, wire: Wire, transport: str, engines: list[int]) -> None:
    """The connection closes, a stdio server exits cleanly, the hung engine ends; a TCP server serves on."""
    wire.closing_ok = True
    if not wire.wait_closed(chk.timeout):
        raise Hang("the connection stayed open after disconnect")
    if transport == "stdio":
        try:
            server.process.wait(chk.timeout)
        except subprocess.TimeoutExpired:
            raise Hang("the stdio server did not exit after disconnect") from None
        chk.expect(server.process.returncode == 0, f"the stdio server exited with status {server.process.returncode}")
    left = gone_within(engines, 15)
    if left:
        raise Hang(f"the hung engine {left} was still running 15 s after disconnect")
    if transport == "tcp":
        wire = server.connect()
        initialize(chk, wire)
        good_launch(chk, wire)
        goodbye(wire)


def build_ended(chk: Check, servers: Servers, server: Server, wire: Wire, hostile: Hostile, transport: str,
                loading: int, mark: int) -> tuple[Server, Wire]:
    """A build that ends by itself: its launch refused, or (chatty) run to its end; the connection to go on with."""
    response = chk.wait(wire, loading, what="launch")
    if not hostile.succeeds:
        chk.expect(not response.get("success"), f"the launch of {hostile.entry} succeeded")
        chk.threads(wire)
        return server, wire
    chk.expect(bool(response.get("success")), f"launch refused: {response.get('message')}")
    wire.wait_event(("initialized",), mark, chk.timeout)
    stop = chk.motion(wire, "configurationDone", {})
    chk.expect(stop is not None and stop.get("body", {}).get("reason") == "end", "the run did not end")
    shown = sum(len(m["body"].get("output", "")) for m in wire.since(mark)
                if m.get("event") == "output" and m.get("body", {}).get("category") == "stdout")
    chk.expect(shown <= 2**20, f"{shown} characters of program output reached the client")
    chk.threads(wire)
    server, wire = servers.reopen(server, wire, transport)
    initialize(chk, wire)
    return server, wire
