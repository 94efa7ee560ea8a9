"""One rank's engine: a process that joins the torch.distributed process group, loads the model file as its rank,
and runs a Session over it at the coordinator's word (docs/ranks.md). `python -m hardware.ranks.worker
--rank-launcher FD` is the rank launcher (hardware/ranks/launcher.py) that forks these processes; `--join
HOST:PORT` is one rank started by torchrun, which joins its coordinator over TCP (hardware/ranks/join.py).

Its motions stop at its next collective (a function breakpoint on each collective op, the fence): the
coordinator lets a rank cross one only when every rank has reached a matching one (the Ledger refuses any
other, so no motion of this rank alone can block in a collective). "pause", "interrupt" and "close" are read at
once by a thread of their own; a close, or the coordinator gone, ends the process even while it waits in a collective.
"""

from __future__ import annotations

import argparse
import bisect
import os
import queue
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from hardware.errors import RewindError
from hardware.events import Output
from hardware.ranks.collectives import Collective, Ledger, check_point_to_point, collectives_of
from hardware.ranks.join import joined_rank_main
from hardware.ranks.launcher import serve
from hardware.ranks.forensics import RankForensics
from hardware.ranks.numerics import RankNumerics
from hardware.ranks.pipe import Pipe, PipeClosed
from hardware.ranks.traces import check_rank_trace
from hardware.session.breakpoints import Breakpoint
from hardware.session.session import FunctionSpec, LaunchOptions, LineSpec, Session
from hardware.ticks import Direction, Stop
from hardware.torch_tensors import COLLECTIVES
from provenance.forensics import Forensics

GROUP_TIMEOUT_S = 300.0  # the gloo group's own timeout: a last safety net (the coordinator lets no rank block)
CLOSE_GRACE_S = 1.0  # a close waits this long for the session to close (a recording to be finished)
MAX_ELEMENTS = 1 << 16  # of one tensor sent whole to the coordinator
_KINDS = {"next": "over", "stepIn": "in", "stepOut": "out"}


class FencedSession(Session):
    """A rank's Session: its function breakpoints are the user's, then a fence on each collective op of its Program,
    which stops a motion before the collective (in a training step's backward too: a data-parallel gradient
    all_reduce). Setting the user's keeps the fences."""

    def __init__(self, on_event: Callable[[Any], None] | None = None):
        super().__init__(on_event=on_event)
        self.fence_ops: list[str] = []
        self.fences: set[int] = set()  # the fences' breakpoint ids
        self.reference_forensics: Forensics | None = None  # over the reference pass run with its peers' (RankForensics)

    @property
    def forensics(self) -> Forensics:
        """Once this rank has run its reference pass with its peers' (hardware/ranks/forensics.py), the forensics over
        it: the usual requests about the reference read that pass. Before, the Session's own (a NaN stop's evidence
        needs no reference; the coordinator runs every rank's reference pass before any request reads one)."""
        return self.reference_forensics if self.reference_current() else super().forensics

    def reference_current(self) -> bool:
        """Has this rank run its reference pass of the pass it holds now?"""
        f = self.reference_forensics
        return f is not None and f.timeline is self.tl

    def set_function_breakpoints(self, specs: Iterable[FunctionSpec]) -> list[Breakpoint]:
        user = list(specs)
        bps = super().set_function_breakpoints(user + [FunctionSpec(op, mode="both") for op in self.fence_ops])
        for fence in bps[len(user):]:
            fence.shown = False  # the client never set it: a stop at it and at one of theirs names only theirs
        self.fences = {bp.id for bp in bps[len(user):]}
        return bps[:len(user)]


class RankEngine(RankNumerics, RankForensics):  # the requests about NaN/Inf across ranks and replicas; forensics
    def __init__(self, rank: int, world_size: int, session: FencedSession | None = None):
        """`session`: one made by a surface of its own (its events go to that surface); else a Session whose output
        becomes this rank's notes."""
        self.rank, self.world_size = rank, world_size
        self.notes: list[str] = []
        self.session = session if session is not None else FencedSession(on_event=self._event)
        self.ledger = Ledger(rank)
        self.collectives: list[Collective] = []

    def _event(self, event: Any) -> None:
        if isinstance(event, Output) and len(self.notes) < 100:
            self.notes.append(event.text.rstrip())

    # -- launch ---------------------------------------------------------------------------------
    def launch(self, options: dict) -> dict:
        s = self.session
        trace = options.get("trace")  # its values come from the file; the CPU, the ranks' device, runs what it lacks
        if trace:  # its bytes must be the ones its index names: hashed here, by every rank at once
            check_rank_trace(options["index"], self.rank, trace, options["bytes"], options["sha256"])
        s.launch(LaunchOptions(program=options.get("program", ""), entry=options.get("entry", "build"),
                               steps=options.get("steps", 1), driver="torch:cpu",
                               budget_mb=float(options.get("budget_mb", 1024.0)), **options.get("ring", {}),
                               stop_on_entry=True, trace=trace, record=options.get("record"),
                               overwrite=bool(options.get("overwrite"))))
        self.collectives = collectives_of(s.program, s.tl.node_tick)
        check_point_to_point(self.collectives, self.rank, self.world_size,
                             None if trace else dist.group.WORLD.group_name)
        s.fence_ops = sorted({s.tl.node_at(c.tick).op for c in self.collectives})
        s.set_function_breakpoints([])
        recorder = s.tl.recorder  # its recording's temporary: adopted by name should this process die
        return {"collectives": [c.to_dict() for c in self.collectives], "outputs": list(s.program.outputs),
                "groups": {} if trace else _groups(self.collectives),
                "partial": None if recorder is None else str(recorder.partial_path), **self.state(None)}

    # -- where this rank is --------------------------------------------------------------------
    def state(self, stop: Stop | None, fenced: bool = False) -> dict:
        """Where this rank is: its position, the collectives it has passed, whether it waits at one (before it
        going forward, right after it going back) and, after a motion, why it stopped ("collective": at a fence)."""
        tl = self.session.tl
        ticks = [c.tick for c in self.collectives]
        passed = bisect.bisect_left(ticks, tl.position)
        out = {"tick": tl.position, "end": tl.end, "frontier": tl.frontier, "passed": passed, "calls": self.ledger.calls,
               "recomputed": tl.recomputed, "replayed": self.ledger.replayed,
               "at_fence": passed < len(ticks) and ticks[passed] == tl.position,
               "at_back_fence": passed > 0 and ticks[passed - 1] + 1 == tl.position}
        if stop is not None:
            fenced = fenced or self.at_fence(stop)
            out["stop"] = {"reason": "collective" if fenced else stop.reason, "description": stop.description,
                           "breakpoints": [i for i in stop.breakpoint_ids if i not in self.session.fences],
                           "exception": self.exception_facts(stop)}  # a NaN/Inf stop, for the coordinator to trace
        return out

    # -- requests --------------------------------------------------------------------------------
    def handle(self, message: dict) -> Any:
        op = message.get("op")
        handler: Callable[[dict], Any] | None = getattr(self, f"do_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise RewindError(f"unknown request '{op}'")
        return handler(message)

    def do_motion(self, m: dict) -> dict:
        """A motion that stops at this rank's next collective: going forward before it, unless `allow` lets it run
        that one (every rank has reached it); going back right after it, unless `allow` lets it go back across."""
        s = self.session
        direction = Direction(m["direction"])
        allow = m.get("allow")
        start = s.tl.position
        if allow is not None and direction is Direction.FORWARD:
            self.ledger.allowed = s.tl.node_at(self.collectives[allow].tick).index
        try:
            kind = m["motion"]
            if kind == "continue":
                stop = s.run(direction)
            elif kind == "node":
                stop = s.step(direction, "instruction")
            else:
                stop = s.step(direction, "statement", _KINDS[kind])
        finally:
            self.ledger.allowed = None
        floor = self._floor(start, allow) if direction is Direction.REVERSE else None
        if floor is not None and s.tl.position < floor:  # it went back across a collective its peers have not
            return self.state(s.goto(floor), fenced=True)
        return self.state(self.unhidden(stop) if direction is Direction.FORWARD else stop)  # a NaN before a fence

    def _floor(self, start: int, allow: int | None) -> int | None:
        """The earliest position a motion back from `start` may reach: right after the last collective before
        `start` (before that, when `allow` names it)."""
        last = bisect.bisect_left([c.tick for c in self.collectives], start) - 1
        k = last - 1 if allow is not None and allow == last else last
        return self.collectives[k].tick + 1 if k >= 0 else None

    def do_goto(self, m: dict) -> dict:
        return self.state(self.session.goto(int(m["tick"])))

    def do_edit(self, m: dict) -> dict:
        """`request`, a request that edits this rank's values (an edit is a new step of its Timeline at its position,
        and forgets the recorded future): refused while that future holds a collective this rank ran with its
        peers; else answered (`answer`), with this rank's collectives, their ticks moved by the new step, and its
        state."""
        tl = self.session.tl
        ran = [c for c in self.collectives if tl.position <= c.tick < tl.frontier]
        if ran:
            last = max(c.tick for c in self.collectives if c.tick < tl.frontier)
            raise RewindError(
                f"at tick {tl.position} of a recorded run that goes on to tick {tl.frontier}, before "
                f"{ran[0].describe()}, which it ran with its peers: an edit here would change what it sent them, and "
                f"what they recorded from it would be stale. Edit after its last collective run (from tick "
                f"{last + 1} on, where nothing recorded depends on its peers), or relaunch and edit before running it")
        answer = self.handle(m["request"])
        self.collectives = collectives_of(self.session.program, tl.node_tick)
        return {"answer": answer, "collectives": [c.to_dict() for c in self.collectives], **self.state(None)}

    def reading(self, doing: str, answer: Callable[[], Any]) -> Any:
        """`answer()`, a request that reads this rank's run (not a motion). One that would run the rank past a
        collective its peers have not reached (a scan over the whole run) is refused in words, the rank left
        where it was."""
        here, self.ledger.refused = self.session.tl.position, None
        try:
            return answer()
        except RewindError:
            node = self.ledger.refused
            if node is None:
                raise
        if self.session.tl.position != here:
            self.session.goto(here)
        c = next(c for c in self.collectives if c.node == node.name)
        raise RewindError(f"{doing} reads this rank's run past tick {c.tick}, where it has not run yet: "
                          f"{c.describe()} runs only with every rank. Run every rank on first (continue), then ask "
                          "again")

    def do_step_in_targets(self, m: dict) -> list[int]:
        """The ticks a step in may go to on this rank: the nodes still to run on the outermost frame's line (which
        holds every frame's)."""
        return [int(t) for t in self.session.step_in_targets(None)]

    def do_step_start(self, m: dict) -> int:
        """The tick where training step `step` starts on this rank (its Program is the step repeated); a step the
        run does not have is refused in the single session's words."""
        return int(self.session.step_start(m["step"]))

    def do_save_trace(self, m: dict) -> dict:
        """This rank's recorded run saved as a trace at `path`, as a single session saves it (values the ring
        evicted recomputed; a collective's from its recorded result, by the ledger)."""
        return self.session.save_trace(str(m["path"]), overwrite=bool(m["overwrite"]))

    def do_where(self, m: dict) -> dict:
        return self.state(None)

    def do_breakpoints(self, m: dict) -> list[dict]:
        bps = self.session.set_line_breakpoints(m["file"], [LineSpec(int(line)) for line in m["lines"]])
        return [{"id": bp.id, "verified": bp.verified, "line": bp.line, "message": bp.message} for bp in bps]

    def do_frames(self, m: dict) -> list[dict]:
        return [{"name": f.name, "file": f.file, "line": f.line, "module": f.module_path}
                for f in self.session.frames()]

    def do_values(self, m: dict) -> dict:
        s = self.session
        return {name: s.value_stats(name) for name in s.live_values()}

    def do_tensor(self, m: dict) -> dict:
        tensor = self.session.tensor(str(m["name"]))
        if not isinstance(tensor, torch.Tensor):
            raise RewindError(f"'{m['name']}' holds no tensor here")
        flat = tensor.detach().cpu().reshape(-1)
        if flat.numel() > MAX_ELEMENTS:
            raise RewindError(f"'{m['name']}' has {flat.numel()} elements, over the {MAX_ELEMENTS} sent whole")
        return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                "values": flat.tolist(), "bytes": flat.contiguous().view(torch.uint8).tolist()}

    def do_evaluate(self, m: dict) -> str:
        value = self.session.evaluate(str(m["expression"]))
        return str(value.tolist()) if isinstance(value, torch.Tensor) and value.numel() <= 64 else str(value)

    def do_locate(self, m: dict) -> dict:
        return self.session.locate(str(m["name"])).to_dict()

    def do_finish(self, m: dict) -> str:
        """The session closed, its recording finished and moved onto its file (before the coordinator writes the
        index of the ranks' traces); the file's path."""
        recorder = self.session.tl.recorder
        self.session.close()
        if recorder is None or os.path.lexists(recorder.partial_path):  # not recording, or not placed: say why
            raise RewindError(f"rank {self.rank}'s trace was not finished"
                              + (f": {self.notes[-1]}" if recorder is not None and self.notes else ""))
        return str(recorder.target_path)

    def do_close(self, m: dict) -> None:
        self.session.close()


def _groups(collectives: list[Collective]) -> dict[str, list[int]]:
    """The ranks of each process group the collectives name (a name the model's `new_group` or DeviceMesh made, the
    same on every rank that made the groups in the same order)."""
    found = {}
    for c in collectives:
        if c.group not in found:
            try:
                group = dist.distributed_c10d._resolve_process_group(c.group)
            except (RuntimeError, ValueError, KeyError) as exc:
                raise RewindError(f"{c.describe()} names process group '{c.group}', which this rank does not know: "
                                  f"{str(exc).strip()}") from None
            found[c.group] = sorted(dist.get_process_group_ranks(group))
    return found


def _serve(engine: RankEngine, pipe: Pipe, requests: "queue.Queue[dict]") -> None:
    while True:
        message = requests.get()
        try:
            pipe.send({"ok": True, "result": engine.handle(message), "notes": _drain(engine.notes)})
        except RewindError as exc:
            pipe.send({"ok": False, "error": str(exc), "notes": _drain(engine.notes)})
        except KeyError as exc:  # a missing key's message is only its repr: say what it was
            pipe.send({"ok": False, "error": f"rank {engine.rank} failed: nothing is named {exc}",
                       "notes": _drain(engine.notes)})
        except Exception as exc:  # the user's code or torch failing mid-motion: this rank says what, and stays
            pipe.send({"ok": False, "error": f"rank {engine.rank} failed: {str(exc).strip() or 'no reason given'}",
                       "notes": _drain(engine.notes)})
        if message.get("op") == "close":
            return


def _drain(notes: list[str]) -> list[str]:
    out = list(notes)
    notes.clear()
    return out


def _read(pipe: Pipe, engine: RankEngine, requests: "queue.Queue[dict]") -> None:
    """Reads the coordinator's messages: a pause reaches the running motion at once; the coordinator gone ends
    this process, whatever it is doing (a collective whose peers are gone never returns)."""
    while True:
        try:
            message = pipe.receive()
        except (PipeClosed, OSError):
            _leave(0)
        if message.get("op") == "pause":
            engine.session.pause()
            continue
        if message.get("op") == "interrupt":  # an evaluation running now stops
            engine.session.interrupt()
            continue
        requests.put(message)
        if message.get("op") == "close":  # a rank busy in the user's code or a collective leaves all the same
            threading.Timer(CLOSE_GRACE_S, _leave, (0,)).start()


def _leave(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _join(rank: int, world_size: int, store: str, timeout_s: float) -> None:
    host, _, port = store.rpartition(":")
    tcp = dist.TCPStore(host, int(port), world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("gloo", store=tcp, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def run_rank(engine: RankEngine, store: str, pipe: Pipe) -> int:
    """A rank's life in its process: join the process group, load its program as the coordinator's first message
    says, then answer the coordinator until it closes. Returns the process's exit code."""
    first = pipe.receive()
    COLLECTIVES.set(engine.ledger.run)
    try:
        _join(engine.rank, engine.world_size, store, GROUP_TIMEOUT_S)  # opened from its trace too: forensics' reference
        result = engine.launch(first)
    except RewindError as exc:
        pipe.send({"ok": False, "error": str(exc), "notes": engine.notes})
        return 1
    except Exception as exc:  # the process group could not form (a peer gone, the store unreachable)
        pipe.send({"ok": False, "error": f"rank {engine.rank} could not join its peers: {str(exc).strip()}",
                   "notes": engine.notes})
        return 1
    pipe.send({"ok": True, "result": result, "notes": _drain(engine.notes)})
    requests: "queue.Queue[dict]" = queue.Queue()
    threading.Thread(target=_read, args=(pipe, engine, requests), daemon=True, name="rewind-rank-pipe").start()
    _serve(engine, pipe, requests)
    return 0


def join_as_rank(address: str, engine: Callable[[int, int], RankEngine]) -> None:
    """This process is a rank torchrun started (RANK, WORLD_SIZE): join the coordinator at `address`, be `engine`
    (rank, world size) until the coordinator closes, and leave with the rank's exit code."""
    _leave(joined_rank_main(address, lambda rank, world_size, store, pipe: run_rank(
        engine(rank, world_size), store, pipe)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hardware.ranks.worker",
                                     description="The launcher of a Rewind session's ranks; started by the "
                                                 "coordinator, not by hand.")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--rank-launcher", type=int, metavar="FD")  # the socket to the coordinator
    how.add_argument("--join", metavar="HOST:PORT", help="a rank started by torchrun (RANK, WORLD_SIZE) joins the "
                     "coordinator listening there (docs/ranks.md, 'Several hosts')")
    args = parser.parse_args(argv)
    if args.join is not None:
        join_as_rank(args.join, RankEngine)
    serve(lambda rank, world_size, store, pipe: run_rank(RankEngine(rank, world_size), store, pipe),
          args.rank_launcher)


if __name__ == "__main__":
    main()
