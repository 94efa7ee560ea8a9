"""files: kill -9 in the middle of writing a trace, and saves onto odd targets.

Tries: SIGKILL of the server and of the engine at seeded moments in saveTrace onto an existing file (with and
without overwrite) and in a recording onto an existing file (overwrite); a recording onto an existing file
without overwrite; a file that appears at a recording's target while it records; saveTrace onto the program's
own source, the recording's target and its partial, a FIFO, a folder, through a symlink (whole and dangling), a
path with a NUL, an existing file without overwrite; saveTrace onto the trace that is open. The model is a
Linear 1024 x12 on a 1024x1024 input, so that a save and a recording take long enough to be cut.

Handled: the saves that must be refused are refused with a message, `threads` is answered afterwards, and no
file is lost. File lost: an existing file changed or removed without `overwrite: true`, or left torn (neither
the old bytes nor a trace that opens); for the odd targets, anything watched created or changed. Engines ending
are expected here. Crash, hang and leak as everywhere.
"""

from __future__ import annotations

import os
import random
import signal
import stat
import time
from pathlib import Path
from typing import Any

from checkpoint import trace as tracefile

from .common import HOSTILE, Check, Crash, Family, Hang, Outcome, Server, SetupError, Wire, alive, gone_within, \
    goodbye, initialize, kill_engine, launch_program, open_trace, preview, wait_until

TITLE = "files (kill -9, odd targets)"
BUDGET_S = (150, 45)  # (default, --quick) seconds
SLOW_MODEL = '''"""Written by benchmarks/hostile.py: big enough that a save and a recording take a while."""
import torch
from torch import nn


class Wide(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def build():
    torch.manual_seed(0)
    return Wide({width}, {depth}), (torch.randn({width}, {width}),)
'''


def trace_state(path: Path) -> str:
    """'trace' (opens whole), 'partial N' (opens, cut short), or why it does not open."""
    try:
        reader = tracefile.TraceReader(path)
    except Exception as exc:  # noqa: BLE001 -- any refusal means the file is not a usable trace
        return f"unreadable ({str(exc)[:160]})"
    try:
        damaged = reader.contents.damaged
        return "trace" if damaged is None else f"partial ({damaged}; {len(reader.contents.steps)} steps)"
    finally:
        reader.close()


def user_file(path: Path, rng: random.Random) -> bytes:
    data = b"USER DATA " + bytes(rng.randrange(256) for _ in range(4096))
    path.write_bytes(data)
    return data


def verdict(chk: Check, path: Path, original: bytes | None, overwrite: bool, what: str) -> None:
    """Files lost: an existing file changed or removed without overwrite, or not the old bytes nor a trace."""
    if original is None:
        return
    if not path.exists() and not path.is_symlink():
        chk.outcome.lost.append(f"{what}: {path.name} is gone")
        return
    current = path.read_bytes() if path.is_file() else None
    if current == original:
        return
    if not overwrite:
        chk.outcome.lost.append(f"{what}: {path.name} was replaced without overwrite ({trace_state(path)})")
        return
    state = trace_state(path)
    if state.startswith("unreadable"):
        chk.outcome.lost.append(f"{what}: {path.name} is torn: {state}")
    elif state != "trace":
        chk.family.notes.append(f"{chk.outcome.label}: {path.name} (overwrite: true) was replaced by a "
                                f"{state} recording")


def partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def snapshot(path: Path) -> Any:
    """What is at `path` (not following a link): its kind and its bytes, link target or listing."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, ValueError):
        return None
    kind = stat.S_IFMT(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        return (kind, path.read_bytes())
    if stat.S_ISLNK(st.st_mode):
        return (kind, os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return (kind, sorted(os.listdir(path)))
    return (kind, None)


class FilesRun:
    """The sessions the files family kills: a stdio server with the slow model loaded and run to its end."""

    def __init__(self, fam: Family, folder: Path, model: Path):
        self.fam, self.folder, self.model, self.rng = fam, folder, model, fam.rng
        self.save_s = 0.3
        self.run_s = 1.5

    def session(self, chk: Check, run: bool = True) -> tuple[Server, Wire]:
        server = Server(self.fam.ctx, "--stop-grace", "1")
        wire = server.wire
        initialize(chk, wire)
        if run:
            launch_program(chk, wire, self.model, stop_on_entry=False)
        return server, wire

    def record_on_entry(self, chk: Check, wire: Wire, target: Path, overwrite: bool = False) -> int:
        """launch the model stopped on entry, recording to `target`; configurationDone. The launch's mark."""
        mark = wire.mark()
        response = chk.request(wire, "launch", {"program": str(self.model), "driver": "torch:cpu", "stopOnEntry": True,
                                                "record": str(target), **({"overwrite": True} if overwrite else {})})
        if not response.get("success"):
            raise SetupError(f"launch with record{' and overwrite' if overwrite else ''} refused: "
                             f"{response.get('message')}")
        wire.wait_event(("initialized",), mark, chk.timeout)
        chk.motion(wire, "configurationDone", {})
        return mark

    def kill(self, victim: str, server: Server, wire: Wire, engines: list[int]) -> bool:
        """SIGKILL the server (its engines then left to finish) or its engines; True when the front lives on."""
        if victim == "engine":
            for pid in engines:
                os.kill(pid, signal.SIGKILL)
            return True
        wire.closing_ok = True
        server.process.kill()
        server.process.wait()
        self.finish(server, engines)
        return False

    def finish(self, server: Server, engines: list[int]) -> None:
        """Let the engines finish what they do without their front (a recording is closed), then stop them."""
        for pid in engines:
            if not wait_until(lambda: not alive(pid), 30):
                self.fam.notes.append(f"an engine (pid {pid}) was still running 30 s after its front died: killed")
                kill_engine(pid)
        server.stop()

    def end(self, chk: Check, server: Server, wire: Wire) -> None:
        """After its engine was killed, the front still answers; then it goes."""
        chk.threads(wire)
        goodbye(wire)
        server.stop()

    def clear(self, target: Path) -> list[str]:
        """Remove the target and the temporaries beside it; the temporaries' names."""
        target.unlink(missing_ok=True)
        left = partials(self.folder)
        for name in left:
            (self.folder / name).unlink(missing_ok=True)
        return left


def calibrate(fam: Family, runs: FilesRun) -> None:
    """Itself an input: a recording and a save onto a new path are whole traces; how long each takes."""
    with fam.check("record, then save onto a new path", f"launch {runs.model.name} stopOnEntry recording to a new "
                   "path; configurationDone; continue; saveTrace onto another new path; disconnect: both open whole"
                   ) as chk:
        server, wire = runs.session(chk, run=False)
        recorded, target = runs.folder / "recorded.rwtrace", runs.folder / "fresh.rwtrace"
        runs.record_on_entry(chk, wire, recorded)
        started = time.monotonic()
        chk.motion(wire, "continue")
        runs.run_s = max(0.3, time.monotonic() - started)
        started = time.monotonic()
        response = chk.request(wire, "saveTrace", {"path": str(target)})
        runs.save_s = max(0.05, time.monotonic() - started)
        chk.expect(bool(response.get("success")), f"saveTrace refused: {response.get('message')}")
        goodbye(wire)
        server.stop()
        for path in (recorded, target):
            chk.expect(trace_state(path) == "trace", f"{path.name} does not open whole: {trace_state(path)}")
        recorded.unlink(missing_ok=True)
    fam.notes.append(f"a recorded run took {runs.run_s:.2f} s and a save {runs.save_s:.2f} s: kills land in "
                     f"[0, 1.5x] of those")


def kill_save(fam: Family, runs: FilesRun, victim: str, overwrite: bool, n: int) -> None:
    target = runs.folder / f"save-{victim}-{n}.rwtrace"
    original = user_file(target, runs.rng)
    delay = runs.rng.uniform(0, 1.5 * runs.save_s)
    repro = (f"stdio server; launch {runs.model.name} (Linear 1024 x12 on a 1024x1024 input), run to the end; "
             f"saveTrace {{path: existing file, overwrite: {str(overwrite).lower()}}}; SIGKILL the {victim} "
             f"{delay * 1000:.0f} ms later")
    with fam.check(f"kill the {victim} {delay * 1000:.0f} ms into saveTrace (overwrite {overwrite})", repro) as chk:
        server, wire = runs.session(chk)
        engines = server.engines()
        seq = chk.send(wire, "saveTrace", {"path": str(target), "overwrite": overwrite})
        time.sleep(delay)
        answered = seq in wire.responses
        if runs.kill(victim, server, wire, engines):
            if not answered:
                response = chk.wait(wire, seq, what="saveTrace after its engine was killed")
                chk.expect(not response.get("success") or overwrite, "saveTrace succeeded without overwrite")
            runs.end(chk, server, wire)
        verdict(chk, target, original, overwrite, "the save's target")
        left = runs.clear(target)
        if left:
            fam.notes.append(f"{chk.outcome.label}: {'killed before the answer' if not answered else 'answered'}; "
                             f"temporaries left beside the target: {left}")


def kill_record(fam: Family, runs: FilesRun, victim: str, n: int) -> None:
    target = runs.folder / f"record-{victim}-{n}.rwtrace"
    original = user_file(target, runs.rng)
    delay = runs.rng.uniform(0.0, 1.5 * runs.run_s)
    repro = (f"stdio server; launch {runs.model.name} with record onto an existing file and overwrite: true, "
             f"stopOnEntry; configurationDone, continue; SIGKILL the {victim} {delay * 1000:.0f} ms into the run")
    with fam.check(f"kill the {victim} {delay * 1000:.0f} ms into a recording (overwrite)", repro) as chk:
        server, wire = runs.session(chk, run=False)
        mark = runs.record_on_entry(chk, wire, target, overwrite=True)
        engines = server.engines()
        chk.send(wire, "continue", {"threadId": 1})
        time.sleep(delay)
        if runs.kill(victim, server, wire, engines):
            wire.wait_event(("terminated",), mark, chk.timeout)
            runs.end(chk, server, wire)
        verdict(chk, target, original, True, "the recording's target")
        left = runs.clear(target)
        if left:
            fam.notes.append(f"{chk.outcome.label}: temporaries left beside the target: {left}")


def kills(fam: Family, runs: FilesRun) -> None:
    plan = [(kind, victim, n) for n in range(2) for victim in ("server", "engine") for kind in ("save", "record")]
    if fam.ctx.quick:
        plan = [("save", "server", 0)]
    for kind, victim, n in plan:
        if fam.out_of_time():
            continue
        if kind == "save":
            kill_save(fam, runs, victim, overwrite=bool(n % 2) if victim == "server" else not n % 2, n=n)
        else:
            kill_record(fam, runs, victim, n)


def record_onto_existing(fam: Family, runs: FilesRun) -> None:
    """A recording onto an existing file without overwrite is refused."""
    with fam.check("record onto an existing file without overwrite", f"launch {runs.model.name} with record onto an "
                   "existing file, no overwrite") as chk:
        target = runs.folder / "record-no-overwrite.rwtrace"
        original = user_file(target, runs.rng)
        server, wire = runs.session(chk, run=False)
        response = chk.request(wire, "launch", {"program": str(runs.model), "driver": "torch:cpu",
                                                "record": str(target)})
        chk.expect(not response.get("success"), "the launch was accepted")
        verdict(chk, target, original, False, "the existing file")
        goodbye(wire)
        server.stop()


def file_appears(fam: Family, runs: FilesRun, killed: bool) -> None:
    """A file that appears at the target while recording is not replaced (the engine killed, or the recording
    finished normally)."""
    target = runs.folder / f"appears-{killed}.rwtrace"
    label = ("a file appears at the recording's target, then the engine is killed" if killed else
             "a file appears at the recording's target, then the session ends normally")
    repro = (f"stdio server; launch {runs.model.name} stopOnEntry with record onto a new path (no overwrite); "
             f"configurationDone; continue; create a file at that path 0.1 s later; "
             + ("SIGKILL the engine" if killed else "wait for the end, disconnect"))
    with fam.check(label, repro) as chk:
        server, wire = runs.session(chk, run=False)
        mark = runs.record_on_entry(chk, wire, target)
        engines = server.engines()
        after = wire.mark()
        chk.send(wire, "continue", {"threadId": 1})
        time.sleep(0.1)
        original = user_file(target, runs.rng)
        if killed:
            time.sleep(0.2)
            runs.kill("engine", server, wire, engines)
            wire.wait_event(("terminated",), mark, chk.timeout)
            chk.threads(wire)
        else:
            wire.wait_event(("stopped",), after, chk.timeout)
        goodbye(wire)
        server.stop()
        gone_within(engines, 20)
        verdict(chk, target, original, False, "the file that appeared")


class OddTargets:
    """saveTrace onto odd targets, in one session recording (a copy of) hostile.py, and onto the open trace."""

    def __init__(self, fam: Family, runs: FilesRun):
        self.fam, self.runs = fam, runs
        folder = self.folder = runs.folder
        self.program = folder / "program.py"
        self.program.write_text(HOSTILE.read_text())
        self.opened = folder / "fresh.rwtrace"  # the save of the first input
        self.recording = folder / "recording.rwtrace"
        fifo = folder / "fifo"
        os.mkfifo(fifo)
        self.a_dir = folder / "a-dir"
        self.a_dir.mkdir()
        (self.a_dir / "inside.txt").write_text("inside\n")
        self.pointed = folder / "pointed.txt"
        self.pointed.write_text("pointed at\n")
        link = folder / "link.rwtrace"
        link.symlink_to(self.pointed)
        dangling = folder / "dangling.rwtrace"
        dangling.symlink_to(folder / "nowhere" / "x.rwtrace")
        self.plain = folder / "plain.rwtrace"
        self.plain_bytes = user_file(self.plain, runs.rng)
        self.targets = [
            ("onto the program's source (overwrite)", self.program, True),
            ("onto the recording's target (overwrite)", self.recording, True),
            ("onto a FIFO", fifo, False), ("onto a FIFO (overwrite)", fifo, True),
            ("onto a folder (overwrite)", self.a_dir, True), ("through a symlink to a file (overwrite)", link, True),
            ("through a symlink to a file", link, False), ("through a dangling symlink", dangling, True),
            ("onto an existing file without overwrite", self.plain, False),
            ("a path with a NUL", Path(f"{self.plain}\x00x"), True),
            ("onto the recording's partial (overwrite)", None, True)]

    def run(self) -> None:
        try:
            with self.fam.setup("setup: a session recording hostile.py", "launch hostile.py (a copy) with record"
                                ) as chk:
                server, wire = self.runs.session(chk, run=False)
                launch_program(chk, wire, self.program, stop_on_entry=False, record=str(self.recording))
        except (Crash, Hang, SetupError) as exc:
            self.fam.setup_failed("odd targets", exc)
            return
        for label, path, overwrite in self.targets:
            if path is None:
                found = [p for p in partials(self.folder) if "recording" in p]
                if not found:
                    continue
                path = self.folder / found[0]
            if self.save_onto(wire, label, path, overwrite).broke:
                self.fam.notes.append(f"the odd-target session stopped after: {label}")
                break
        goodbye(wire)
        server.stop()
        if self.opened.exists():
            self.save_onto_open_trace()
        if snapshot(self.plain) != (stat.S_IFREG, self.plain_bytes):
            self.fam.notes.append("plain.rwtrace changed over the odd-target saves")

    def save_onto(self, wire: Wire, label: str, path: Path, overwrite: bool) -> Outcome:
        """A save that must be refused, touching nothing it could reach."""
        watched = (path, self.pointed, self.a_dir / "inside.txt", self.folder / "nowhere" / "x.rwtrace")
        state = {where: snapshot(where) for where in watched}
        arguments = {"path": str(path), "overwrite": overwrite}
        with self.fam.check(f"saveTrace {label}", f"stdio server recording a copy of hostile.py to "
                            f"{self.recording.name}: saveTrace {preview(arguments)} ({label})") as chk:
            response = chk.request(wire, "saveTrace", arguments)
            chk.expect(not response.get("success"), f"the save was accepted: {preview(response, 200)}")
            for where, before in state.items():
                now = snapshot(where)
                if now != before:
                    what = "created" if before is None else "changed"
                    chk.outcome.lost.append(f"{where.name} {what} (was {str(before)[:60]}, now {str(now)[:60]})")
            chk.threads(wire)
        return chk.outcome

    def save_onto_open_trace(self) -> None:
        before = self.opened.read_bytes()
        with self.fam.check("saveTrace onto the open trace (overwrite)", "stdio server: launch {trace: T}; saveTrace "
                            "{path: T, overwrite: true}") as chk:
            server, wire = self.runs.session(chk, run=False)
            if open_trace(chk, wire, self.opened):
                response = chk.request(wire, "saveTrace", {"path": str(self.opened), "overwrite": True})
                chk.expect(not response.get("success"), "the save onto the open trace was accepted")
            chk.threads(wire)
            if self.opened.read_bytes() != before:
                chk.outcome.lost.append("the open trace changed")
            goodbye(wire)
            server.stop()


def run(fam: Family) -> None:
    fam.engine_deaths_expected = True
    folder = fam.ctx.sandbox / "files"
    folder.mkdir()
    model = folder / "slow.py"
    model.write_text(SLOW_MODEL.replace("{width}", "1024").replace("{depth}", "12"))
    runs = FilesRun(fam, folder, model)
    calibrate(fam, runs)
    kills(fam, runs)
    record_onto_existing(fam, runs)
    for killed in ((True,) if fam.ctx.quick else (True, False)):
        if not fam.out_of_time():
            file_appears(fam, runs, killed)
    if fam.time_left():
        OddTargets(fam, runs).run()
