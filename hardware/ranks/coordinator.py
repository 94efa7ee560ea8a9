"""The coordinator: one debug session over the N ranks of a torch.distributed program (docs/ranks.md).

It starts one engine process per rank (hardware/ranks/worker.py), which join one gloo process group through a
TCPStore the coordinator serves (on loopback unless MASTER_ADDR/MASTER_PORT or `rendezvous` say otherwise), and
moves them through consistent cuts: every rank has passed the same number of collectives at every stop. Going
forward, a rank waits before its next collective until every rank has reached one, and they run it together only
when the ranks' collectives match (op, group, dtypes, shapes, reduce op); when they do not, or a rank has reached
its end while its peers wait at a collective, the session stops before any rank blocks, naming each side, with
every rank alive. Going back is symmetric: a rank waits right after its last collective until every rank is
there, and then they all go back across it. A rank that does not answer within `timeout_s` is reported with
every rank's position instead of a deadlock.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from hardware.errors import RewindError, echo, os_reason
from hardware.frontends.torch_train import check_steps
from hardware.ranks import forensics, traces
from hardware.ranks.collectives import Collective, Pairing, mismatch
from hardware.ranks.launcher import MAX_RANK_OUTPUT, MAX_RANKS, RANK_MODULE, RankLauncher, exit_code
from hardware.ranks.join import address_of, joined_ranks, store_beside
from hardware.ranks.lines import bound_where_run
from hardware.ranks.numerics import ReplicaCheck, checked_filters, explained
from hardware.ranks.pipe import Pipe, PipeClosed
from hardware.session.state import LaunchOptions
from hardware.ticks import Direction

MOTIONS = ("continue", "next", "stepIn", "stepOut", "node")
_ENDED = ("collective", "end", "entry")  # a rank's motion ended for no reason of its own: its peers decide
_LOG_TAIL = 2000  # characters of a gone rank's output quoted


@dataclass
class CutStop:
    """Where a motion of every rank ended: why, in words, the rank the stop is about, and each rank's position."""

    reason: str  # entry, step, breakpoint, function breakpoint, exception, pause, goto, end
    description: str
    rank: int | None
    ticks: dict[int, int] = field(default_factory=dict)
    finding: bool = False  # an exception the coordinator found (a mismatch, a rank that did not answer), no rank's
    breakpoints: list[int] = field(default_factory=list)  # the user's breakpoints the rank stopped at
    exception: dict | None = None  # a NaN/Inf traced across ranks, a replicas drift: its details (ranks/numerics.py)
    # the other ranks that stopped for a reason of their own in the same motion: rank -> (its words, its breakpoints)
    others: dict[int, tuple[str, list[int]]] = field(default_factory=dict)


class _Rank:
    def __init__(self, rank: int, pid: int | None, pipe: Pipe, folder: Path):  # pid None: it joined
        self.rank, self.pid, self.pipe, self.folder = rank, pid, pipe, folder
        self.log = folder / f"rank{rank}.log"
        self.printed = folder / f"rank{rank}.stdout"  # what its program prints (hardware/ranks/launcher.py)
        self.printed_at = 0  # bytes of it handed on
        self.state: dict = {}
        self.collectives: list[Collective] = []
        self.outputs: list[str] = []  # the Program's output values
        self.partial: str | None = None  # the temporary it records its trace to (None: not recording)
        self.busy: str | None = None  # the request it has not answered in time
        self.gone: str | None = None  # why it can answer nothing more

    def output(self) -> str:
        try:
            text = self.log.read_text(errors="replace").strip()
        except OSError:
            return ""
        return text[-_LOG_TAIL:]

    def printed_lines(self, rest: bool = False) -> tuple[list[str], bool]:
        """The lines its program printed since last asked: whole lines only, unless `rest` (it has ended: its last
        line too), and whether it printed more than MAX_RANK_OUTPUT bytes, the rest of which is not handed on."""
        if self.printed_at > MAX_RANK_OUTPUT:
            return [], False
        try:
            with open(self.printed, "rb") as f:
                f.seek(self.printed_at)
                data = f.read(MAX_RANK_OUTPUT + 1 - self.printed_at)
        except OSError:  # a rank that joined prints on its own host; a launch that failed early printed nothing
            return [], False
        over = self.printed_at + len(data) > MAX_RANK_OUTPUT
        if not (rest or over):
            data = data[:data.rfind(b"\n") + 1]  # a line still being printed waits for its end
        self.printed_at += len(data)
        lines = data[:len(data) - over].decode("utf-8", "replace").split("\n")
        if lines[-1] == "":
            lines.pop()
        return [line.removesuffix("\r") for line in lines], over


class Coordinator:
    def __init__(self, program: str | None = None, ranks: int | None = None, entry: str = "build",
                 budget_mb: float = 1024.0, timeout_s: float = 60.0, launch_timeout_s: float = 240.0,
                 rendezvous: str | None = None, launcher: RankLauncher | None = None,
                 on_notes: Callable[[int | None, list[str]], None] | None = None, record: str | None = None,
                 overwrite: bool = False, trace: str | None = None, replicas: list[str] | None = None,
                 join: str | None = None, steps: int = 1,
                 on_printed: Callable[[int, list[str]], None] | None = None, ring: dict | None = None):
        """Start `ranks` engines on `program` and wait until each has loaded its rank's Program (stopped at
        entry); any failure ends every rank and says which rank failed and why. `launcher`: the rank launcher
        that forks them (else one of this coordinator's own, ended with it); `on_notes` hears what a rank's
        Session said (its output), with the rank (None: the coordinator's own, what to run for ranks to join). `record`: each rank records its trace beside this path, and
        close() writes their index at it (hardware/ranks/traces.py; existing files are replaced only with
        `overwrite`). `trace`: open the ranks of the index at this path post-mortem instead of a program: every
        collective's result read from the traces (their process group, on loopback, runs forensics' reference
        passes). `replicas`: the values that must stay identical on every rank (set_replicas). `join` (host:port):
        no rank is forked; ranks started by torchrun on any host join there over TCP (hardware/ranks/join.py), and
        the store is served beside it.
        `steps`: a training step's entry is unrolled that many times on every rank (its collectives numbered on
        across the steps). `on_printed` hears the lines a rank's program printed (its stdout), with the rank, in
        order, after each answer of the rank and when it ends (a rank that joined prints on its own host).
        `ring`: how every rank's checkpoint ring is kept besides its budget, as LaunchOptions.ring_settings names
        it (`{"every": 4}`: a checkpoint every 4 ticks), each rank's Session taking it as one session does."""
        self.steps = _checked_steps(steps, trace)
        self._ring = _checked_ring(ring)
        self.index = _opened_index(trace, program, ranks, record)  # the index of the traces this session opened
        self.world_size = self.index.world_size if self.index is not None else _checked_ranks(ranks)
        self.timeout_s = _checked_seconds(timeout_s, "timeout")
        if self.index is None and (not isinstance(program, str) or not os.path.isfile(program)):
            raise RewindError(f"program file not found: {echo(str(program), 200)}")
        self._recording = None if record is None else (traces.record_targets(
            record, self.world_size, overwrite, {os.path.abspath(program): "the program being debugged"}), overwrite,
            os.path.abspath(program), entry)  # (index, overwrite, program, entry)
        self.source = (self.index.program, self.index.entry) if self.index is not None else (
            os.path.abspath(program), entry)  # (program, entry): what an index of the ranks' traces names
        self.recorded: Path | None = None  # the index close() wrote
        self.ranks: list[_Rank] = []
        self.last_stop: CutStop | None = None
        self.replicas: ReplicaCheck | None = None
        self.pairing = Pairing({}, {})  # which collectives of the ranks run together (set once they are known)
        self.groups: dict[str, tuple[int, ...]] = {}  # each process group's ranks, by name
        self._pause = threading.Event()
        self._send_lock = threading.Lock()
        # the forked ranks' logs and exit codes; ranks that join keep theirs on their hosts: no folder is made (an
        # engine ended while it waits for them to join leaves none behind)
        self._folder = Path(tempfile.mkdtemp(prefix="rewind-ranks-")) if join is None else Path(
            tempfile.gettempdir(), f"rewind-ranks-joined-{secrets.token_hex(8)}")
        self._store = None
        self._closed = False
        self._own_launcher = launcher is None
        self._launcher = launcher
        self._on_notes = on_notes
        self._on_printed = on_printed
        try:
            # ranks opened from traces meet on loopback: their reference passes run the collectives (forensics)
            self._store, address = _serve_store("127.0.0.1:0" if self.index is not None else
                                                rendezvous or store_beside(join), self.world_size)
            if join is not None:  # ranks started elsewhere (by torchrun) join over TCP: hardware/ranks/join.py
                say = None if on_notes is None else (lambda words: on_notes(None, [words]))  # the surface's
                module = launcher.module if launcher is not None else RANK_MODULE
                forked = joined_ranks(join, self.world_size, address, launch_timeout_s, self.index is not None, say,
                                      module)
            else:
                if self._launcher is None:
                    self._launcher = RankLauncher()
                forked = self._launcher.fork(self.world_size, address, self._folder, launch_timeout_s)
            self.ranks = [_Rank(r, pid, pipe, self._folder) for r, (pid, pipe) in enumerate(forked)]
            replies = self._ask({r: self._launch_message(r, program, entry, budget_mb)
                                 for r in range(self.world_size)}, launch_timeout_s, "loading its program")
            for rank in self.ranks:
                reply = replies[rank.rank]
                rank.collectives = [Collective.from_dict(d) for d in reply.pop("collectives")]
                if self.index is not None:
                    traces.check_agrees(self.index, rank.rank, rank.collectives)
                rank.outputs = reply.pop("outputs")
                rank.partial = reply.pop("partial")
                self.groups.update({name: tuple(members) for name, members in reply.pop("groups").items()})
                rank.state = reply
            if self.index is not None:
                self.groups = dict(self.index.groups)
            self._pair()
            self.set_replicas(replicas)
        except BaseException:
            self.close()
            raise
        self.last_stop = CutStop("entry", "stopped on entry", None, self.ticks())

    def _pair(self) -> None:
        self.pairing = Pairing.of(self._collectives(), self.groups)

    def partners(self, rank: int, number: int) -> dict[int, int]:
        """The collectives that run with rank `rank`'s collective #`number` (from 1): each rank's that takes part
        (`rank`'s own included) -> its number there (every rank's for a collective of the process group; the
        peer's recv or send for a send or recv)."""
        return {q: m + 1 for q, m in self.pairing.group(rank, number - 1).items()}

    def senders(self, rank: int, number: int) -> dict[int, int]:
        """The partners whose data rank `rank`'s collective #`number` brings in (a send's or batch's: the ranks that
        send to it), each with its number there."""
        return self._peers(rank, number, "recv")

    def receivers(self, rank: int, number: int) -> dict[int, int]:
        """The partners rank `rank`'s collective #`number` carries its data to, each with its number there."""
        return self._peers(rank, number, "send")

    def _peers(self, rank: int, number: int, direction: str) -> dict[int, int]:
        c = self.ranks[rank].collectives[number - 1]
        return {q: m + 1 for q, m in self.pairing.peers(c, rank, number - 1, direction).items()}

    def _collectives(self) -> dict[int, list[Collective]]:
        return {rank.rank: rank.collectives for rank in self.ranks}

    def _launch_message(self, rank: int, program: str | None, entry: str, budget_mb: float) -> dict:
        """What rank `rank` loads: its trace, or the program (recording its trace beside the index)."""
        message = {"op": "launch", "entry": entry, "budget_mb": budget_mb, "ring": self._ring, "steps": self.steps}
        if self.index is not None:  # the rank checks its file's bytes are the index's (every rank at once)
            mine = self.index.ranks[rank]
            return {**message, "trace": str(mine.path), "index": str(self.index.path), "bytes": mine.size,
                    "sha256": mine.sha256}
        message["program"] = os.path.abspath(program)
        if self._recording is not None:
            message.update(record=str(traces.rank_file(self._recording[0], rank)), overwrite=self._recording[1])
        return message

    # -- processes -------------------------------------------------------------------------------
    def close(self) -> None:
        """End every rank (at once for one stuck in a collective or in the user's code), and the rendezvous.
        With `record`, each rank's trace is finished first, then their index is written (`recorded`); a
        recording that cannot be finished raises a RewindError saying why, once every rank has ended."""
        if self._closed:
            return
        try:
            unfinished = self._finish_recording()
        finally:  # whatever finishing raised (a surface's on_notes failing, an interrupt), every rank ends
            self._closed = True
            self._end_ranks()
        if unfinished is not None:
            raise RewindError(unfinished)

    def _end_ranks(self) -> None:
        """Close every rank's session, kill those that do not end within seconds, then end the launcher (when it
        is this coordinator's own) and remove the ranks' folder."""
        for rank in self.ranks:
            if rank.gone is None:
                try:
                    with self._send_lock:
                        rank.pipe.send({"op": "close"})
                except PipeClosed:
                    pass
        deadline = time.monotonic() + 5.0
        for rank in self.ranks:
            if rank.pid is None:  # a rank that joined (no process of ours to kill): its connection is shut
                rank.pipe.wait_closed(max(0.1, deadline - time.monotonic()))
            elif exit_code(rank.folder, rank.rank, max(0.1, deadline - time.monotonic())) is None:
                _kill(rank.pid)
                exit_code(rank.folder, rank.rank, 5.0)  # reaped by the launcher
            rank.pipe.close()
            rank.gone = rank.gone or "the session is closed"
        try:
            for rank in self.ranks:  # what each printed last, now that every one has ended
                self._hear(rank, rest=True)
        finally:
            self._store = None
            if self._own_launcher and self._launcher is not None:
                self._launcher.close()
            self._launcher = None
            shutil.rmtree(self._folder, ignore_errors=True)

    def _finish_recording(self) -> str | None:
        """Each rank finishes its trace (moved onto its file), or has what it recorded adopted when its process has
        ended (_adopt), then the index of them is written beside them; what went wrong, in words, else None. Nothing
        to do without `record`, or after a launch that failed."""
        if self._recording is None or self.last_stop is None:
            return None
        index, overwrite, program, entry = self._recording
        for rank in self.ranks:  # one killed since it last answered: its recording is adopted, not asked for
            if rank.gone is None and rank.busy is None and _hung_up(rank.pipe):
                self._gone(rank, "recording its trace")
        gone = [rank.rank for rank in self.ranks if rank.gone is not None]
        try:
            kept = self._adopt(index, overwrite, gone)
            try:
                self._ask({r: {"op": "finish"} for r in range(self.world_size) if r not in gone},
                          max(self.timeout_s, 60.0), "finishing its trace")
            except RankTrouble:  # a rank that ended meanwhile (the others have finished): adopted as well
                late = [rank.rank for rank in self.ranks if rank.gone is not None and rank.rank not in gone]
                if not late:
                    raise
                kept += self._adopt(index, overwrite, late)
            self.recorded = traces.write_index(index, overwrite, program, entry,
                                               [rank.collectives for rank in self.ranks], self.groups)
        except RewindError as exc:
            return f"the index of the ranks' traces was not written at {index}: {exc}"
        if kept and self._on_notes is not None:
            self._on_notes(None, kept)
        return None

    def _adopt(self, index: Path, overwrite: bool, gone: list[int]) -> list[str]:
        """The recordings of the ranks whose processes ended before they finished their traces, each moved onto its
        file as it is (hardware/ranks/traces.adopt_rank_trace), every one tried; words saying where each is, or a
        RewindError naming every rank whose recording could not be kept."""
        kept, failed = [], []
        for r in gone:
            try:
                path = traces.adopt_rank_trace(index, r, overwrite, self.ranks[r].partial)
            except RewindError as exc:
                failed.append(str(exc))
                continue
            kept.append(f"rank {r} ended before finishing its trace: what it recorded is kept in {path} (it reads up "
                        "to its last complete step)")
        if failed:
            raise RewindError("; ".join(failed))
        return kept

    def save_traces(self, path: str, overwrite: bool = False) -> dict:
        """Every rank's recorded run saved as its own trace beside `path` (`rank_file`: run.rwtrace ->
        run.rank0.rwtrace, …) by its Session as a single session saves one, at once, then their index written at
        `path` (opened post-mortem with trace=path). Nothing is destroyed: the index and every rank's file are
        checked before any rank writes (an existing file replaced only with `overwrite`; a file the session uses,
        a link, a folder, never), and the set is written whole or not at all: each rank saves to a hidden temporary
        beside its file, and only when every rank has saved are they moved onto their files, then the index
        written; a rank that cannot save leaves every file as it was. The index's path and size, and each rank's
        answer (its `rank`, `path`, `bytes`, `ticks`)."""
        index = traces.record_targets(path, self.world_size, overwrite, self._files_in_use(), "write")
        if not index.parent.is_dir():
            raise RewindError(f"cannot write {index}: the folder {index.parent} does not exist")
        finals = {r: traces.rank_file(index, r) for r in range(self.world_size)}
        hidden = {r: f.with_name(f".{f.name}.{os.getpid()}-{secrets.token_hex(4)}.saving") for r, f in finals.items()}
        try:
            saved = self._ask({r: {"op": "save_trace", "path": str(hidden[r]), "overwrite": False}
                               for r in range(self.world_size)}, max(self.timeout_s, 60.0), "saving its trace")
            for r in range(self.world_size):
                os.replace(hidden[r], finals[r])
        except OSError as exc:
            raise RewindError(f"cannot save the ranks' traces beside {index}: {os_reason(exc)}") from None
        except RewindError as exc:  # a rank's words name the temporary it wrote to: named by the user's file
            said = str(exc)
            for r in hidden:
                said = said.replace(str(hidden[r]), str(finals[r]))
            raise RewindError(said) from None
        finally:
            for temporary in hidden.values():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
        traces.write_index(index, overwrite, *self.source, [rank.collectives for rank in self.ranks], self.groups)
        return {"path": str(index), "bytes": os.path.getsize(index),
                "ranks": [{"rank": r, **saved[r], "path": str(finals[r])} for r in range(self.world_size)]}

    def _files_in_use(self) -> dict[str, str]:
        """The files of the session as a whole, which a save must never replace (each rank's Session refuses its
        own too: its program's sources, its open trace, its recording)."""
        used = {self.source[0]: "the program being debugged"}
        if self.index is not None:
            used[str(self.index.path)] = "the index of the traces this session has open"
            used.update({str(t.path): f"rank {t.rank}'s trace, which this session has open" for t in self.index.ranks})
        if self._recording is not None:
            used[str(self._recording[0])] = "the index this session is recording to"
            used.update({str(traces.rank_file(self._recording[0], r)): f"rank {r}'s recording"
                         for r in range(self.world_size)})
        return used

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def pids(self) -> list[int]:
        return [rank.pid for rank in self.ranks]

    # -- requests ---------------------------------------------------------------------------------
    def _ask(self, messages: dict[int, dict], timeout: float, doing: str, moves: bool = False) -> dict[int, Any]:
        """Send each rank its message, then wait for every answer (they work at once). A rank's refusal is a
        RewindError naming the rank; a rank gone or silent past `timeout` is a RankTrouble, which says where the
        others are (`moves`: the answers are the ranks' new states, kept as they arrive)."""
        usable = {r: self._usable(r) for r in messages}  # every rank free before any is sent anything
        sent: list[int] = []
        for r, message in messages.items():
            try:
                with self._send_lock:
                    usable[r].pipe.send(message)
            except PipeClosed:
                self._gone(usable[r], doing)
                for other in sent:  # what was sent is answered, so no later request reads its answer
                    self._drain(self.ranks[other], timeout)
                raise RankTrouble(self._trouble_report([r], doing), r) from None
            sent.append(r)
        deadline = time.monotonic() + timeout
        answers, errors, trouble = {}, [], []
        for r in messages:
            rank = self.ranks[r]
            try:
                reply = rank.pipe.receive(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                rank.busy = f"{doing} (from tick {rank.state.get('tick', 0)})"
                trouble.append(r)
                continue
            except PipeClosed:
                trouble.append(r)
                self._gone(rank, doing)
                continue
            self._hear(rank)
            if reply.get("notes") and self._on_notes is not None:
                self._on_notes(r, [str(n) for n in reply["notes"]])
            if reply.get("ok"):
                answers[r] = reply.get("result")
                if moves:
                    rank.state = answers[r]
            else:
                errors.append(f"rank {r}: {reply.get('error')}" if self.world_size > 1 else str(reply.get("error")))
        if trouble:
            raise RankTrouble(self._trouble_report(trouble, doing), trouble[0])
        if errors:
            raise RewindError("; ".join(errors))
        return answers

    def _usable(self, r: int) -> _Rank:
        rank = self.ranks[r]
        if rank.gone is not None:
            raise RewindError(f"rank {r} {rank.gone}: close the session")
        if rank.busy is not None:
            try:  # its late answer, if it has come: the rank is free again, where that answer says it is
                late = rank.pipe.receive(0.0)
                rank.busy = None
                if late.get("ok") and isinstance(late.get("result"), dict) and "tick" in late["result"]:
                    rank.state = late["result"]
            except TimeoutError:
                raise RewindError(f"rank {r} is still busy {rank.busy}") from None
            except PipeClosed:
                self._gone(rank, rank.busy)
                raise RewindError(f"rank {r} {rank.gone}: close the session") from None
        return rank

    def _gone(self, rank: _Rank, doing: str) -> None:
        code = exit_code(rank.folder, rank.rank, 2.0) if rank.pid is not None else None
        said = rank.output()
        how = f"exit code {code}" if code is not None else (
            "its pipe closed" if rank.pid is not None else "its connection closed")
        rank.gone = f"ended while {doing} ({how})" + (f"; its last output:\n{said}" if said else "")
        self._hear(rank, rest=True)

    def _hear(self, rank: _Rank, rest: bool = False) -> None:
        """Hand what rank `rank`'s program printed since last heard to `on_printed` (`rest`: it has ended)."""
        if self._on_printed is None:
            return
        lines, over = rank.printed_lines(rest)
        if lines:
            self._on_printed(rank.rank, lines)
        if over and self._on_notes is not None:
            self._on_notes(rank.rank, [f"its program printed more than {MAX_RANK_OUTPUT >> 20} MiB: the rest is not "
                                       "shown"])

    def _drain(self, rank: _Rank, timeout: float) -> None:
        """Read and drop the answer to what `rank` was sent; a rank that does not answer in time is busy with it."""
        try:
            rank.pipe.receive(timeout)
        except TimeoutError:
            rank.busy = "answering a request its peers could not take"
        except PipeClosed:
            self._gone(rank, "answering")

    def _trouble_report(self, troubled: list[int], doing: str) -> str:
        """The troubled ranks, why, then where every other (launched) rank is."""
        parts = []
        for rank in sorted(self.ranks, key=lambda k: k.rank not in troubled):
            if rank.rank in troubled and rank.gone is not None:
                parts.append(f"rank {rank.rank} {rank.gone}")
            elif rank.rank in troubled:
                parts.append(f"rank {rank.rank} did not return within {self.timeout_s:g} s while {doing}, from "
                             f"{self._where(rank)}")
            elif rank.state:
                parts.append(f"rank {rank.rank} is at {self._where(rank)}")
        return "; ".join(parts)

    def _where(self, rank: _Rank) -> str:
        state = rank.state
        tick, passed = state.get("tick", 0), state.get("passed", 0)
        nxt = rank.collectives[passed] if passed < len(rank.collectives) else None
        shown = f"before {nxt.describe()}" if nxt is not None and nxt.tick == tick else (
            f"with {passed} collective(s) run")
        return f"tick {tick} ({shown})"

    # -- where the ranks are ------------------------------------------------------------------------
    def ticks(self) -> dict[int, int]:
        return {rank.rank: rank.state.get("tick", 0) for rank in self.ranks}

    def states(self) -> dict[int, dict]:
        """Each rank's position: tick, end, collectives passed, waiting at one (at_fence, at_back_fence)."""
        return {rank.rank: dict(rank.state) for rank in self.ranks}

    def collectives(self, rank: int) -> list[Collective]:
        return list(self.ranks[self._rank(rank)].collectives)

    def schedule(self, rank: int) -> dict:
        """Rank `rank`'s communication, as a flight recorder keeps it but for the whole program, run or not: its
        position, and each collective, send and recv in the order it runs them, with the ranks of its process group,
        its partners ((rank, its index there), index None: the rank has none to match it), and whether it has run."""
        r = self._rank(rank)
        state = self.ranks[r].state
        waits = "before" if state.get("at_fence") else ("after" if state.get("at_back_fence") else None)
        return {"rank": r, "tick": state.get("tick", 0), "passed": state.get("passed", 0), "waits": waits,
                "collectives": [{"collective": c, "group": list(self.groups.get(c.group, range(self.world_size))),
                                 "partners": list(self.pairing.partners.get((r, i), [])),
                                 "ran": i < state.get("passed", 0)}
                                for i, c in enumerate(self.ranks[r].collectives)]}

    def outputs(self, rank: int) -> list[str]:
        """The names of rank `rank`'s Program outputs."""
        return list(self.ranks[self._rank(rank)].outputs)

    # -- motions ---------------------------------------------------------------------------------------
    def pause(self) -> None:
        """Thread-safe: stop the running motion of every rank at its next tick."""
        self._pause.set()
        self._tell_all({"op": "pause"})

    def interrupt(self) -> None:
        """Thread-safe: stop the evaluation a rank runs now (each reads this at once, even while busy)."""
        self._tell_all({"op": "interrupt"})

    def _tell_all(self, message: dict) -> None:
        for rank in self.ranks:
            if rank.gone is None:
                try:
                    with self._send_lock:
                        rank.pipe.send(message)
                except PipeClosed:
                    pass

    def run(self, direction: Direction = Direction.FORWARD, rank: int = 0, single: bool = False) -> CutStop:
        """Continue (or reverse-continue) every rank until one stops for a reason of its own (a breakpoint, a
        pause) or the ranks' collectives do not match; collectives on the way run with every rank. `single`: rank
        `rank` alone, as step's."""
        if single:
            return self._alone(direction, "continue", self._rank(rank))
        return self._move(direction, "continue", repeat=True)

    def step(self, direction: Direction = Direction.FORWARD, kind: str = "next", rank: int = 0,
             single: bool = False) -> CutStop:
        """One step of every rank that may move (next, stepIn, stepOut by source line; node: one node): a rank
        waiting at a collective stays until its peers reach it; when all wait at it, the step runs it. The stop
        is about `rank` when it moved and stopped for no reason of another rank's. `single`: rank `rank` alone
        steps, its peers staying where they are (_alone)."""
        if kind not in MOTIONS or kind == "continue":
            raise RewindError(f"unknown step '{echo(str(kind))}': next, stepIn, stepOut or node")
        if single:
            return self._alone(direction, kind, self._rank(rank))
        return self._move(direction, kind, repeat=False, about=self._rank(rank))

    def _alone(self, direction: Direction, kind: str, r: int) -> CutStop:
        """Rank `r` alone runs `kind`; it never crosses a collective, so the cut stays consistent: forward its fence
        stops it before its next one, back it stops right after its last. A rank waiting there stays, and the
        stop says so: a collective is crossed only by every rank together."""
        forward = direction is Direction.FORWARD
        rank = self.ranks[r]
        if rank.state["at_fence" if forward else "at_back_fence"]:
            return self._stopped(CutStop("step", f"rank {r}: {self._stays(rank, forward)}", r))
        message = {"op": "motion", "motion": kind, "direction": direction.value, "allow": None}
        try:
            replies = self._ask({r: message}, self.timeout_s, f"running {kind} alone", moves=True)
        except RankTrouble as trouble:
            return self._stopped(CutStop("exception", str(trouble), trouble.rank, finding=True))
        return self._stopped(self._rank_stop(r, replies))

    def _stays(self, rank: _Rank, forward: bool) -> str:
        passed, collectives = rank.state["passed"], rank.collectives
        c = collectives[passed] if forward else collectives[passed - 1]
        peers = sorted({q for q, _ in self.pairing.partners.get((rank.rank, c.number - 1), [])})
        who = ", ".join(f"rank {q}" for q in peers)
        if not c.point_to_point:
            who = "every rank" if len(peers) == self.world_size - 1 else f"the ranks of its process group ({who})"
        if forward:
            return (f"waits before {c.describe()}, which runs only with {who}: alone it stays here (step every rank "
                    "to run it)")
        what = "a collective" if not c.point_to_point else "a send or recv"
        return (f"waits after {c.describe()}; going back across {what} takes {who}: alone it stays here (step every "
                "rank back to cross it)")

    def _move(self, direction: Direction, kind: str, repeat: bool, about: int = 0) -> CutStop:
        forward = direction is Direction.FORWARD
        while True:
            if self._pause.is_set():
                return self._stopped(CutStop("pause", "paused", None))
            movers, allow, blocked = self._movers(forward)
            if blocked is not None:
                return self._stopped(CutStop("exception", blocked[0], blocked[1], finding=True))
            if not movers:
                return self._stopped(CutStop("end", "end of program", None) if forward
                                     else CutStop("entry", "beginning of the program", None))
            message = {"op": "motion", "motion": kind, "direction": direction.value}
            before = self.ticks()
            about_waited = self.ranks[about].state["at_fence" if forward else "at_back_fence"]
            try:
                replies = self._ask({r: {**message, "allow": allow.get(r)} for r in movers}, self.timeout_s,
                                    f"running {kind}", moves=True)
                drift = self.replicas.check(self, before) if forward and self.replicas is not None else None
            except RankTrouble as trouble:
                return self._stopped(CutStop("exception", str(trouble), trouble.rank, finding=True))
            if drift is not None:  # a replica differs between the ranks: every rank is right after its write
                return self._stopped(CutStop("exception", drift[0], drift[1], finding=True, exception=drift[2]))
            own = [r for r in movers if replies[r]["stop"]["reason"] not in _ENDED]
            if own or not repeat:  # a step's stop is about `about`, unless a rank stopped for more than a step
                notable = [r for r in own if replies[r]["stop"]["reason"] != "step"]
                if not notable and not repeat and about not in movers and about_waited:
                    return self._stopped(self._waits(about, forward, movers))
                r = (notable or [m for m in movers if m == about] or own or movers)[0]
                stop = self._rank_stop(r, replies)
                stop.others = {q: (f"rank {q}: {self._said(self.ranks[q], replies[q]['stop'])}",
                                   list(replies[q]["stop"]["breakpoints"])) for q in notable if q != r}
                return self._stopped(stop)

    def _waits(self, r: int, forward: bool, moved: list[int]) -> CutStop:
        """The stop of a step of rank `r` that could not move: it waits at a collective (a send, a recv) whose
        partners have not reached theirs; the ranks that moved instead."""
        rank = self.ranks[r]
        where = self._said(rank, {"reason": "collective"})
        return CutStop("step", f"rank {r}: {where}, until its partners reach it (the step moved "
                               f"{', '.join(f'rank {m}' for m in moved)})", r)

    def _rank_stop(self, r: int, replies: dict[int, dict]) -> CutStop:
        """The stop of a motion about rank `r`, from the answers of the ranks that moved."""
        stop = replies[r]["stop"]
        reason = "step" if stop["reason"] in _ENDED else stop["reason"]
        said = self._said(self.ranks[r], stop)
        traced = explained(self, r, said, replies) if reason == "exception" else None  # a NaN/Inf's birth
        description, exception = traced or (f"rank {r}: {said}", None)
        return CutStop(reason, description, r, breakpoints=list(stop["breakpoints"]), exception=exception)

    def _said(self, rank: _Rank, stop: dict) -> str:
        """Why a rank's motion stopped, in words: at a collective, its own words, else its reason."""
        if stop["reason"] == "collective":
            passed, collectives = rank.state["passed"], rank.collectives
            if rank.state["at_fence"]:
                return f"waits before {collectives[passed].describe()}"
            return f"waits after {collectives[passed - 1].describe()}"
        return stop["description"] or stop["reason"]

    def _movers(self, forward: bool) -> tuple[list[int], dict[int, int], tuple[str, int] | None]:
        """The ranks that move now (those not waiting at a collective, and those whose collectives every partner
        waits at: they cross them together), the collective each of those crosses (rank -> its index), and why
        none may move (a mismatch, or ranks that all wait for one another: words and the rank it is about)."""
        states = {rank.rank: rank.state for rank in self.ranks}
        if forward:
            done = [r for r, s in states.items() if s["tick"] >= s["end"]]
            waiting = {r: s["passed"] for r, s in states.items() if s["at_fence"]}
        else:
            done = [r for r, s in states.items() if s["tick"] == 0]
            waiting = {r: s["passed"] - 1 for r, s in states.items() if s["at_back_fence"]}
        free = [r for r in states if r not in done and r not in waiting]
        found = self._disagree(waiting) if forward else None
        if found is not None:
            return [], {}, found
        ready = self.pairing.ready(waiting)
        movers = sorted(free + list(ready))
        if movers or not waiting:
            return movers, ready, None
        return [], {}, self._stuck(waiting, forward)

    def _disagree(self, waiting: dict[int, int]) -> tuple[str, int] | None:
        """A collective whose partners all wait at theirs, and which does not match them (op, group, dtypes, shapes,
        reduce op; a send and its recv: dtype and element count): words naming each side, and the rank it is
        about. Found before any of them runs it."""
        for r, i in sorted(waiting.items()):
            for q, m, why in self.pairing.conflicts.get((r, i), []):
                if waiting.get(q) == m:
                    a, b = sorted([(r, i), (q, m)])
                    return (f"rank {a[0]} calls {self.ranks[a[0]].collectives[a[1]].describe()}; rank {b[0]} calls "
                            f"{self.ranks[b[0]].collectives[b[1]].describe()}: {why}", r)
            partners = self.pairing.partners[(r, i)]
            if not all(m is not None and waiting.get(q) == m for q, m in partners):
                continue  # its partners are not all here yet
            group = {r: i, **dict(partners)}
            found = self._past_recording(group) if self.index is not None else None
            if found is None and not self.ranks[r].collectives[i].point_to_point:  # every rank of its group waits
                found = mismatch({q: self.ranks[q].collectives[m] for q, m in group.items()},
                                 {q: self.ranks[q].state["passed"] for q in group})
            if found is not None:
                return found
        return None

    def _past_recording(self, group: dict[int, int]) -> tuple[str, int] | None:
        """Ranks opened from traces that end at different places: a collective some of them read from their trace
        and the others would run for real, past their trace's end (alone in gloo: a hang). Words and the rank."""
        held = {q: self.ranks[q].collectives[m].tick < self.ranks[q].state["frontier"] for q, m in group.items()}
        if len(set(held.values())) < 2:
            return None
        a = min(q for q, h in held.items() if h)
        b = min(q for q, h in held.items() if not h)
        return (f"rank {b}'s trace ends before {self.ranks[b].collectives[group[b]].describe()}, which rank {a}'s "
                f"trace holds ({self.ranks[a].collectives[group[a]].describe()}): past the end of a recording a "
                "collective runs only where every rank taking part runs it, and rank "
                f"{a} would read its result from its trace (this index's traces end at different places)", b)

    def _stuck(self, waiting: dict[int, int], forward: bool) -> tuple[str, int]:
        """Words for ranks that all wait at collectives none of which can run (each needs a rank that waits
        elsewhere or has reached its end): what each calls and where its partners join it; the rank it is about."""
        passed = {rank.rank: rank.state["passed"] for rank in self.ranks}
        if forward and all(not self.ranks[r].collectives[i].point_to_point
                           and len(self.pairing.partners[(r, i)]) == self.world_size - 1 for r, i in waiting.items()):
            nxt = {q: (self.ranks[q].collectives[waiting[q]] if q in waiting else None) for q in passed}
            found = mismatch(nxt, passed)  # collectives of the process group only: each side, in its words
            if found is not None:
                return found
        parts, about, missing = [], None, set()
        for r, i in sorted(waiting.items()):
            c = self.ranks[r].collectives[i]
            unmet = []
            for q, ms in self._by_rank(self.pairing.partners[(r, i)]).items():
                if ms == [waiting.get(q)] and ms != [None]:
                    continue
                about = r if about is None else about
                others = [self.ranks[q].collectives[m].describe() for m in ms if m is not None]
                if None in ms:
                    missing.add(q)
                    unmet.append(f"and rank {q} has no {self._counterpart(c, q)} to match it")
                elif len(others) > 1:  # a batch whose peer runs its matching sends and recvs one after the other
                    unmet.append(f"which rank {q} joins only in separate steps, at {' and '.join(others)} (a batch "
                                 f"runs only with every partner waiting at once: batch rank {q}'s too)")
                else:
                    unmet.append(f"which rank {q} joins only {'later, ' if forward else ''}at {others[0]}")
            verb = "calls" if forward else "waits after"
            parts.append(", ".join([f"rank {r} {verb} {c.describe()}"] + unmet))
        for q in sorted(missing - set(waiting)):
            if forward and passed[q] >= len(self.ranks[q].collectives):
                parts.append(f"rank {q} reaches the end of the program after {passed[q]} collective(s)")
        how = "runs only with its partners" if forward else "is crossed back only with its partners"
        return "; ".join(parts) + f": no rank can go on (a collective, a send or a recv {how})", \
            about if about is not None else min(waiting, default=0)

    @staticmethod
    def _by_rank(partners: list[tuple[int, int | None]]) -> dict[int, list[int | None]]:
        """A collective's partners by rank: each rank's matching collectives (several for a batch whose peer sends
        and receives in separate nodes)."""
        found: dict[int, list[int | None]] = {}
        for q, m in partners:
            if m not in found.setdefault(q, []):
                found[q].append(m)
        return found

    @staticmethod
    def _counterpart(c: Collective, peer: int) -> str:
        """What a peer would call to match `c`: a recv for a send to it, a send for a recv from it."""
        if not c.point_to_point:
            return "collective of its process group"
        return "recv" if any(d == "send" and p == peer for d, p, _, _ in c.p2p) else "send"

    def goto(self, tick: int, rank: int = 0, replicas: bool = True) -> CutStop:
        """Rank `rank` to `tick`; every other rank to a consistent cut with it (the collectives it must cross first
        crossed with their partners, in order, forward or back). Forward, it stops at the first write of a replica
        where the ranks differ, as a forward motion does (`replicas` False: it does not, the replicas check itself
        putting the ranks at one)."""
        r = self._rank(rank)
        end = self.ranks[r].state["end"]
        if isinstance(tick, bool) or not isinstance(tick, int) or not 0 <= tick <= end:
            raise RewindError(f"tick {echo(str(tick))} is outside rank {r}'s program (0..{end})")
        target = sum(1 for c in self.ranks[r].collectives if c.tick < tick)
        before = self.ticks()
        try:
            for direction in (Direction.FORWARD, Direction.REVERSE):
                forward = direction is Direction.FORWARD
                bound = self._bounds(r, target, forward)
                while any(self._beyond(rank, bound, forward) for rank in self.ranks):
                    blocked = self._cross(direction, bound)
                    if blocked is not None:
                        return self._stopped(blocked)
            self._ask({r: {"op": "goto", "tick": tick}}, self.timeout_s, "going to a tick", moves=True)
            checked = replicas and self.replicas is not None and tick > before[r]  # back, no rank moves forward
            drift = self.replicas.check(self, before) if checked else None
        except RankTrouble as trouble:
            return self._stopped(CutStop("exception", str(trouble), trouble.rank, finding=True))
        if drift is not None:  # a replica differs between the ranks: every rank is right after its write
            return self._stopped(CutStop("exception", drift[0], drift[1], finding=True, exception=drift[2]))
        return self._stopped(CutStop("goto", f"rank {r} at tick {tick}", r))

    def _bounds(self, r: int, target: int, forward: bool) -> dict[int, int]:
        """How many collectives each rank must have passed (forward: at least; back: at most) for rank `r` to have
        passed `target`: the partners of each collective crossed (or crossed back) with it, and, on each partner's
        rank, the ones before it (after it, back) first. The nearest consistent cut: no other rank moves."""
        passed = {rank.rank: rank.state["passed"] for rank in self.ranks}
        bound = {**passed, r: target}
        changed = True
        while changed:
            changed = False
            for q in list(bound):
                for i in (range(passed[q], bound[q]) if forward else range(bound[q], passed[q])):
                    for p, m in self.pairing.partners.get((q, i), []):
                        want = None if m is None else (m + 1 if forward else m)
                        if want is not None and (want > bound[p] if forward else want < bound[p]):
                            bound[p], changed = want, True
        return bound

    @staticmethod
    def _beyond(rank: _Rank, bound: dict[int, int], forward: bool) -> bool:
        """Rank `rank` has collectives to cross (forward) or cross back before it is within `bound`."""
        passed = rank.state["passed"]
        return passed < bound[rank.rank] if forward else passed > bound[rank.rank]

    def _cross(self, direction: Direction, bound: dict[int, int] | None = None) -> CutStop | None:
        """Every rank with a collective to cross (forward: up to `bound`) or to cross back (back: down to `bound`;
        None: any) to it: before its next one, or right after its last one; then every collective whose partners
        all wait at theirs is crossed by them together. A mismatch, or ranks all waiting for one another, stops
        short, before any rank runs one (worded with the ranks brought to their next one)."""
        forward = direction is Direction.FORWARD
        where = {}
        for rank in self.ranks:
            n = rank.state["passed"]
            if bound is not None and not self._beyond(rank, bound, forward):
                continue
            if forward and n < len(rank.collectives):
                where[rank.rank] = rank.collectives[n].tick
            elif not forward and n > 0:
                where[rank.rank] = rank.collectives[n - 1].tick + 1
        self._ask({r: {"op": "goto", "tick": t} for r, t in where.items() if t != self.ranks[r].state["tick"]},
                  self.timeout_s, "going to a collective", moves=True)
        states = {rank.rank: rank.state for rank in self.ranks}
        waiting = {r: s["passed"] if forward else s["passed"] - 1 for r, s in states.items()
                   if s["at_fence" if forward else "at_back_fence"] and r in where}
        found = self._disagree(waiting) if forward else None
        ready = self.pairing.ready(waiting) if found is None else {}
        if found is None and not ready:  # bounded, every rank the target needs waits here: none other is moved
            found = self._stuck(waiting, forward)
        if found is not None:
            return CutStop("exception", found[0], found[1], finding=True)
        self._ask({q: {"op": "motion", "motion": "node", "direction": direction.value, "allow": i}
                   for q, i in ready.items()}, self.timeout_s, "running a collective", moves=True)
        return None

    def _stopped(self, stop: CutStop) -> CutStop:
        self._pause.clear()
        stop.ticks = self.ticks()
        self.last_stop = stop
        return stop

    # -- breakpoints, exception filters, replicas, and inspection per rank ----------------------------------------
    def set_line_breakpoints(self, file: str, lines: list[int]) -> dict[int, list[dict]]:
        """Line breakpoints in `file` on every rank (each rank binds them to its own Program; a line where a node runs
        on some ranks binds on those only, moved on none: hardware/ranks/lines.py)."""
        message = {"op": "breakpoints", "file": str(file), "lines": [int(x) for x in lines]}
        return bound_where_run(
            self._ask({r: message for r in range(self.world_size)}, self.timeout_s, "setting breakpoints"),
            lambda keep: self._ask({r: {**message, "lines": [message["lines"][i] for i in places]}
                                    for r, places in keep.items()}, self.timeout_s, "setting breakpoints"))

    def set_exception_filters(self, filters: list[str]) -> None:
        """The exception filters (nan, inf, …) every rank's motions stop on; a NaN/Inf a collective carried from a
        peer is traced to the rank where it was born (hardware/ranks/numerics.py)."""
        message = {"op": "exception_filters", "filters": checked_filters(filters)}
        self._ask({r: message for r in range(self.world_size)}, self.timeout_s, "setting exception filters")

    def forensics(self, start: int = 0) -> dict:
        """Each rank's first divergence from its tick `start` on against a float64 reference pass of the same ranks
        (run by every rank at once, each collective for real), the collective that carried an error between
        ranks, and the root: the rank and line that introduced it (hardware/ranks/forensics.py)."""
        return forensics.forensics(self, start)

    def set_replicas(self, patterns: list[str] | None) -> None:
        """The values that must stay identical on every rank (source variables, Program values, parameter paths, or
        fnmatch patterns of them; None: none): a forward motion stops at the first write where they differ."""
        self.replicas = ReplicaCheck(self, patterns) if patterns is not None else None

    def values(self, rank: int) -> dict[str, dict]:
        """The live values at rank `rank`'s position, each with its stats."""
        return self._one(rank, {"op": "values"})

    def tensor(self, rank: int, name: str) -> dict:
        """A value of rank `rank`: dtype, shape, its elements and its bytes."""
        return self._one(rank, {"op": "tensor", "name": str(name)})

    def evaluate(self, rank: int, expression: str) -> str:
        return self._one(rank, {"op": "evaluate", "expression": str(expression)})

    def locate(self, rank: int, name: str) -> dict:
        """Where a value of rank `rank` lives (its Placement: chip, unit, memory space, address)."""
        return self._one(rank, {"op": "locate", "name": str(name)})

    def frames(self, rank: int) -> list[dict]:
        return self._one(rank, {"op": "frames"})

    def ask(self, rank: int, message: dict, doing: str) -> Any:
        """A request of rank `rank`'s engine that the coordinator does not know (a surface's own: the ranks of
        dap_server/engine.py answer DAP requests); `doing` says what it is, in words, should it fail."""
        r = self._rank(rank)
        return self._ask({r: message}, self.timeout_s, doing)[r]

    def ask_all(self, message: dict, doing: str) -> dict[int, Any]:
        """`message` to every rank; their answers by rank."""
        return self.ask_each({r: message for r in range(self.world_size)}, doing)

    def ask_each(self, messages: dict[int, dict], doing: str) -> dict[int, Any]:
        """Each rank its own message (they work at once); their answers by rank."""
        return self._ask({self._rank(r): m for r, m in messages.items()}, self.timeout_s, doing)

    def edit(self, rank: int, message: dict, doing: str) -> Any:
        """A request of rank `rank`'s engine that edits its values, a new step at its position: refused by the rank
        while its recorded future holds a collective it ran with its peers (their recorded results would be stale);
        else its answer, the rank's collectives and position read anew (the new step moved them on by one)."""
        r = self._rank(rank)
        reply = self._ask({r: {"op": "edit", "request": message}}, self.timeout_s, doing)[r]
        self.ranks[r].collectives = [Collective.from_dict(d) for d in reply.pop("collectives")]
        self._pair()
        answer = reply.pop("answer")
        self.ranks[r].state = reply
        if self.replicas is not None:  # the new step moved the ticks the replicas are written at: read them anew
            self.set_replicas(self.replicas.patterns)
        return answer

    def _one(self, rank: int, message: dict) -> Any:
        return self.ask(rank, message, f"answering {message['op']}")

    def _rank(self, rank: Any) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise RewindError(f"no rank {echo(str(rank))}: this session has ranks 0..{self.world_size - 1}")
        return rank


class RankTrouble(RewindError):
    """A rank is gone or did not answer in time; the words name every rank's position."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def _checked_ranks(ranks: Any) -> int:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS:
        raise RewindError(f"ranks is the number of processes of the torch.distributed program, a whole number from "
                          f"1 to {MAX_RANKS}; got {echo(repr(ranks))}")
    return ranks


def _opened_index(trace: str | None, program: str | None, ranks: Any, record: str | None) -> traces.TraceIndex | None:
    """The index of ranks' traces a session opens (checked whole, with its ranks' files); None without `trace`."""
    if trace is None:
        return None
    if program or record is not None:
        raise RewindError("open a trace of many ranks, or run a program (and record it): not both")
    index = traces.read_index(trace)
    if ranks is not None and ranks != index.world_size:
        raise RewindError(f"the index {index.path} holds {index.world_size} ranks' traces, not {echo(repr(ranks))}")
    return index


def _checked_steps(steps: Any, trace: str | None) -> int:
    check_steps(steps)
    if trace is not None and steps != 1:  # the Program each rank's trace holds is unrolled already
        raise RewindError(f"a trace of many ranks holds the training steps it recorded: open it without steps "
                          f"(got {steps})")
    return steps


def _checked_ring(ring: Any) -> dict:
    """The ring settings the ranks take: LaunchOptions' own names only (their values as a launch's: the surface that
    made them checks them, as DAP's launch arguments do)."""
    known = LaunchOptions().ring_settings()
    if ring is None:
        return {}
    if not isinstance(ring, dict) or not set(ring) <= set(known):
        raise RewindError(f"ring is a dict of the checkpoint ring's settings ({', '.join(known)}); got "
                          f"{echo(repr(ring))}")
    return dict(ring)


def _checked_seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise RewindError(f"{what} is a number of seconds above 0 (at most a day); got {echo(repr(value))}")
    return float(value)


def _serve_store(rendezvous: str | None, world_size: int) -> tuple[Any, str]:
    """The TCPStore the ranks meet at: `rendezvous` (host:port), else $MASTER_ADDR:$MASTER_PORT, else a free port on
    loopback. Returns the store and its host:port."""
    given = rendezvous or (f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ['MASTER_PORT']}"
                           if os.environ.get("MASTER_PORT") else "127.0.0.1:0")
    host, port = address_of(given, "rendezvous", "127.0.0.1:29500")
    try:
        store = dist.TCPStore(host, port, world_size + 1, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=60))
    except (RuntimeError, OSError, ValueError) as exc:
        raise RewindError(f"cannot serve the ranks' rendezvous at {echo(given)}: {str(exc).strip()}") from None
    return store, f"{host}:{store.port}"


def _hung_up(pipe: Pipe) -> bool:
    """Has the rank at the other end of `pipe` ended (its end closed, as a process's end closes it)? Asked of a rank
    that owes no answer, so nothing is read but the end."""
    try:
        pipe.receive(0.0)
    except TimeoutError:
        return False
    except PipeClosed:
        return True
    return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended meanwhile
        pass
