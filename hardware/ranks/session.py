"""A session of many ranks with the Session's interface, for a surface (the DAP adapter) to drive when a launch asks
for `ranks` (docs/ranks.md).

Its motions are the Coordinator's: every rank moves, each stop is a consistent cut, and it ends in one Stopped event
about one rank (its unit is the rank). A mismatch between the ranks' collectives, or a rank that does not answer,
is an exception stop of the coordinator's own: the `hang` finding (the hang it prevented), whose words
`exception_info()` gives. Everything about one rank's values is asked of that rank's engine (`ask`), which answers
with a Session of its own.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from hardware.errors import RewindError
from hardware.events import ExceptionDetails, Output, SessionEvent, Stopped
from hardware.ranks import forensics
from hardware.ranks.collectives import Collective
from hardware.ranks.coordinator import Coordinator, CutStop
from hardware.ranks.launcher import RankLauncher
from hardware.ranks.numerics import exception_details
from hardware.session.state import LaunchOptions
from hardware.ticks import Direction, Stop, Tick

_STEPS = {"over": "next", "in": "stepIn", "out": "stepOut"}


class RankedSession:
    def __init__(self, on_event: Callable[[SessionEvent], None], launcher_module: str = "hardware.ranks.worker",
                 hello: dict | None = None):
        """`launcher_module`: the module whose `--rank-launcher` forks the ranks (their engine decides what they
        answer); `hello`: a message every rank is sent once it has loaded its program (the surface's settings)."""
        self.on_event = on_event
        self.coordinator: Coordinator | None = None
        self.last_stop: Stop | None = None
        self.line_breakpoints: dict = {}  # none kept here: each rank binds breakpoints to its own Program
        self.breakpoint_ids = BreakpointIds()
        self.breakpoints_set: dict[str, Any] = {}  # what the surface set on the ranks, by BreakpointIds group: a
        # relaunch's new ranks know none of it, so the surface sets it on them again (dap_server/ranks.py)
        self._launcher_module, self._hello = launcher_module, hello
        self._launcher: RankLauncher | None = None
        self._stop_on_entry = False
        self.timeout_s = 60.0  # a rank that does not answer a motion within it is reported, with every position

    # -- loading ------------------------------------------------------------------------------------------
    def launch(self, options: LaunchOptions) -> None:
        """Start `options.ranks` ranks on the program (each recording its trace, with `record`), or open the ranks
        of the index `options.trace`; each stopped on entry (a relaunch ends the previous ranks, writing a
        recording's index; the launcher stays for the next)."""
        _refuse_unsupported(options)
        self._close_ranks()
        if self._launcher is None:
            self._launcher = RankLauncher(self._launcher_module)
        self.coordinator = Coordinator(None if options.trace else options.program, options.ranks,
                                       entry=options.entry, budget_mb=options.budget_mb, timeout_s=self.timeout_s,
                                       launcher=self._launcher, on_notes=self._notes, record=options.record,
                                       overwrite=options.overwrite, trace=options.trace, replicas=options.replicas,
                                       rendezvous=options.rendezvous, join=options.join, steps=options.steps,
                                       on_printed=self._printed, ring=options.ring_settings())
        self._stop_on_entry = options.stop_on_entry
        self.breakpoint_ids.new_ranks()  # the surface sets its breakpoints on them again, under the same ids
        if self._hello is not None:
            self.coordinator.ask_all(self._hello, "taking the session's settings")
        self.last_stop = self._stop(self.coordinator.last_stop)

    @property
    def loaded(self) -> bool:
        return self.coordinator is not None

    def units(self) -> list[str]:
        return [f"rank {r}" for r in range(self.coordinator.world_size)] if self.coordinator is not None else []

    def end_of(self, rank: int) -> int:
        """The last position of rank `rank`'s Program."""
        return self._ranks().states()[rank]["end"]

    def ask(self, rank: int, message: dict, doing: str) -> Any:
        return self._ranks().ask(rank, message, doing)

    def ask_all(self, message: dict, doing: str) -> dict[int, Any]:
        return self._ranks().ask_all(message, doing)

    def ask_each(self, messages: dict[int, dict], doing: str) -> dict[int, Any]:
        return self._ranks().ask_each(messages, doing)

    def edit(self, rank: int, message: dict, doing: str) -> Any:
        """A request that edits rank `rank`'s values (Coordinator.edit: refused where it would make its peers'
        recorded results stale)."""
        return self._ranks().edit(rank, message, doing)

    # -- motions: each ends in one Stopped event ------------------------------------------------------------
    def start(self) -> None:
        """After configuration: stay on entry, or run every rank to the first stop."""
        if self._stop_on_entry:
            self._emit(CutStop("entry", "stopped on entry", None, self._ranks().ticks()))
        else:
            self.run(Direction.FORWARD)

    def restart(self) -> None:
        """Every rank back to its beginning (a goto puts one rank there, the others in the same segment)."""
        for rank in range(self._ranks().world_size):
            self._ranks().goto(0, rank)
        self._emit(CutStop("entry", "back at the beginning", None, self._ranks().ticks()))

    def run(self, direction: Direction = Direction.FORWARD, unit: int | None = None,
            single_thread: bool = False) -> None:
        """Every rank continues; with `single_thread`, rank `unit` alone, up to its next collective at most."""
        self._emit(self._ranks().run(direction, rank=unit or 0, single=single_thread))

    def step(self, direction: Direction, granularity: str = "statement", kind: str = "over", unit: int | None = None,
             single_thread: bool = False) -> None:
        """Every rank steps (a line, or one node at instruction granularity); the stop is about rank `unit`. With
        `single_thread` rank `unit` alone steps, the others staying: forward up to its next collective at most,
        back to right after its last (Coordinator._alone)."""
        motion = "node" if granularity == "instruction" else _STEPS[kind]
        self._emit(self._ranks().step(direction, motion, rank=unit or 0, single=single_thread))

    def goto(self, tick: int, rank: int = 0, description: str | None = None, reason: str = "goto") -> None:
        """Rank `rank` to `tick`, every other rank to the consistent cut around it; `description` and `reason`: the
        stop's when it gets there (a stop on the way, a mismatch or a replica that differs, keeps its own)."""
        cut = self._ranks().goto(tick, rank)
        if cut.reason == "goto":
            cut.reason, cut.description = reason, description or cut.description
        self._emit(cut)

    def step_start(self, step: int, rank: int) -> int:
        """Where training step `step` (from 0) starts on rank `rank`, whose Program is the step repeated; a step the
        run does not have is refused, naming the rank."""
        return self._ranks().ask(rank, {"op": "step_start", "step": step}, "finding where a training step starts")

    def goto_step(self, step: int, rank: int, tick: int) -> None:
        """Rank `rank` to the start of its training step `step` (at its `tick`: step_start), every other rank to the
        consistent cut around it."""
        self.goto(tick, rank, f"rank {rank}: start of step {step} (step {step}, tick {tick})")

    def restore(self, tick: int, rank: int) -> None:
        """Rank `rank` to its checkpoint at `tick`; the other ranks hold no checkpoint of that instant (each rank
        checkpoints its own Timeline), so they go to the consistent cut around it, as for a goto."""
        self.goto(tick, rank, f"rank {rank}: restored its checkpoint at tick {tick}")

    def save_trace(self, path: str, overwrite: bool = False) -> dict:
        """Every rank's trace beside `path` and their index at it (Coordinator.save_traces)."""
        return self._ranks().save_traces(path, overwrite)

    def crossed(self, rank: int, tick: int) -> Collective | None:
        """The first collective rank `rank` would cross going from where it is to `tick` (None: none)."""
        low, high = sorted((self._ranks().states()[rank]["tick"], tick))
        return next((c for c in self._ranks().collectives(rank) if low <= c.tick < high), None)

    def step_into(self, tick: int, rank: int) -> None:
        """Rank `rank` to the instant before the node at `tick` on its line (a goto: a collective on the way is
        crossed by every rank)."""
        self.goto(tick, rank, f"rank {rank}: stepped in to tick {tick}", reason="step")

    def pause(self) -> None:
        if self.coordinator is not None:
            self.coordinator.pause()

    def interrupt(self) -> None:
        if self.coordinator is not None:
            self.coordinator.interrupt()

    def forensics(self, start: int = 0) -> dict:
        """Every rank's first divergence against a float64 reference of the same ranks (Coordinator.forensics)."""
        return self._ranks().forensics(start)

    def reference_passes(self) -> None:
        """Every rank's float64 reference pass, run now on all ranks at once unless kept from before, so that a
        request asked of one rank's engine reads its reference (hardware/ranks/forensics.py)."""
        forensics.reference_passes(self._ranks())

    def carried_into(self, rank: int) -> dict[str, dict]:
        """What brought the error into each of rank `rank`'s collectives, by its node (hardware/ranks/forensics.py)."""
        return forensics.carried_into(self._ranks(), rank)

    def exception_info(self) -> ExceptionDetails:
        stop = self.last_stop
        if stop is None or stop.exception is None:
            raise RewindError("not stopped on an exception of the ranks (a mismatch of their collectives, or a "
                              "rank that did not answer)")
        return stop.exception

    def end_run(self) -> None:
        """End the ranks of the run loaded now (a recording's index is written then); the launcher stays."""
        self._close_ranks()

    def close(self) -> None:
        self._close_ranks()
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None

    # -- helpers ------------------------------------------------------------------------------------------------
    def _ranks(self) -> Coordinator:
        if self.coordinator is None:
            raise RewindError("no program is loaded: launch it with ranks first")
        return self.coordinator

    def _close_ranks(self) -> None:
        """End the ranks; a recording's index is written then, and a recording that could not be finished is said."""
        coordinator, self.coordinator = self.coordinator, None
        if coordinator is not None:
            try:
                coordinator.close()
            except RewindError as exc:
                self.on_event(Output(f"{exc}\n"))

    def _notes(self, rank: int | None, notes: list[str]) -> None:
        """What a rank's Session said; rank None: the coordinator's own words (what to run for ranks to join)."""
        for note in notes:
            self.on_event(Output(f"rank {rank}: {note}\n", "log") if rank is not None
                          else Output(f"{note}\n", "important"))

    def _printed(self, rank: int, lines: list[str]) -> None:
        """What a rank's program printed, each line under its rank (as a single session's program's prints, stdout)."""
        self.on_event(Output("".join(f"[rank {rank}] {line}\n" for line in lines), "stdout"))

    def _emit(self, cut: CutStop) -> None:
        self.last_stop = self._stop(cut)
        self.on_event(Stopped(cut.reason, self.last_stop.description, tuple(self.last_stop.breakpoint_ids),
                              self.last_stop.unit))

    def _stop(self, cut: CutStop) -> Stop:
        """The Stop of a cut: about its rank (rank 0 when it is about every rank); its words say every rank's
        position (a finding's words say them already)."""
        rank = cut.rank if cut.rank is not None else 0
        where = ", ".join(f"rank {r} at tick {t}" for r, t in sorted(cut.ticks.items()))
        said = "; ".join([self.breakpoint_ids.named(rank, cut.description, cut.breakpoints)] + [
            self.breakpoint_ids.named(q, words, theirs) for q, (words, theirs) in sorted(cut.others.items())])
        description = said if cut.finding else f"{said} ({where})"
        hit = self.breakpoint_ids.of(rank, cut.breakpoints) + [
            i for q, (_, theirs) in sorted(cut.others.items()) for i in self.breakpoint_ids.of(q, theirs)]
        exception = (exception_details(cut.exception) if cut.exception is not None  # a NaN/Inf across ranks, replicas
                     else self._finding(cut, description) if cut.finding else None)
        return Stop(cut.reason, Tick(cut.ticks.get(rank, 0)), description, sorted(set(hit)), exception=exception,
                    unit=rank)

    def _finding(self, cut: CutStop, description: str) -> ExceptionDetails:
        """A mismatch or a rank that did not answer, as exception details: the collective the stop's rank is
        about to call, when it waits at one."""
        coordinator = self._ranks()
        rank = cut.rank if cut.rank is not None else 0
        state = coordinator.states()[rank]
        collectives = coordinator.collectives(rank)
        nxt = collectives[state["passed"]] if state.get("at_fence") else None
        return ExceptionDetails(filter="hang", node=nxt.node if nxt else "", op=nxt.op if nxt else "",
                                source=nxt.where if nxt else None, value=nxt.value if nxt else "", count=0,
                                first_index=None, inputs={},
                                evidence={"message": description, "rank": rank, "ticks": dict(cut.ticks)})


class BreakpointIds:
    """The session's breakpoint ids over the ranks' own. Each rank's Session numbers its breakpoints itself, so the
    ranks' ids collide, and one breakpoint set on every rank has an id on each: the session gives it one of its own,
    which a stop on any of those ranks names."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[tuple[int, int], int]] = {}  # per kind of breakpoint (lines: per file)
        self._given: dict[str, list[int]] = {}  # each group's ids, in the order they were given
        self._next = 1

    def assign(self, group: str, on_ranks: list[dict[int, int]], again: bool = False) -> list[int]:
        """The session's ids of the breakpoints of `group` (a kind of breakpoint, each request replacing its
        group's), given each breakpoint's id on every rank it is set on. With `again` (the same breakpoints set on
        a relaunch's new ranks) each keeps the id it was given, in order: the client knows them by those."""
        before = self._given.get(group, []) if again else []
        table, ids = {}, []
        for place, theirs in enumerate(on_ranks):
            ours = before[place] if place < len(before) else self._take()
            ids.append(ours)
            table.update({(rank, bp): ours for rank, bp in theirs.items()})
        self._groups[group], self._given[group] = table, ids
        return ids

    def _take(self) -> int:
        self._next += 1
        return self._next - 1

    def new_ranks(self) -> None:
        """A relaunch started new ranks: the ranks' own ids name none of the session's until the breakpoints are set
        on them again (`assign` with `again`)."""
        self._groups.clear()

    def of(self, rank: int, theirs: list[int]) -> list[int]:
        """The session's ids of breakpoints rank `rank` stopped at, by its own ids."""
        found = [table.get((rank, bp)) for bp in theirs for table in self._groups.values()]
        return [i for i in found if i is not None]

    def named(self, rank: int, words: str, theirs: list[int]) -> str:
        """Rank `rank`'s words about the breakpoints it stopped at (hardware/session/breakpoints.py's: `breakpoint 3
        at model.py:41`, by its own ids `theirs`), each breakpoint named by the session's id instead."""
        ours = {str(bp): self.of(rank, [bp]) for bp in theirs}
        return _NUMBERED.sub(lambda m: f"breakpoint {ours[m[1]][0]}" if ours.get(m[1]) else m[0], words)


_NUMBERED = re.compile(r"\bbreakpoint (\d+)\b")  # how a Session's stop names a breakpoint it stopped at


def _refuse_unsupported(options: LaunchOptions) -> None:
    """What a launch with ranks cannot do yet, said before any rank starts."""
    unsupported = [(options.faults, "sim chip faults"),
                   (options.trace and options.driver != "auto", f"a driver ('{options.driver}') for a trace (a "
                                                                "trace of many ranks opens on the CPU)"),
                   (options.driver not in ("auto", "torch:cpu"), f"the driver '{options.driver}' (ranks run on "
                                                                   "the CPU, with gloo)")]
    said = [words for present, words in unsupported if present]
    if said:
        raise RewindError(f"{', '.join(said)} with ranks is not supported yet")
