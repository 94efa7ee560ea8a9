"""Problems: every finding of a run, each as an editor shows it — the node (and so the source lines),
how severe, and one message naming the node, the values and the failure pattern.

A collector reads a Session and returns Problems; `collect` runs them all. Races and hangs
come from the recorded schedules of a many-unit chip, the numerical ones from
provenance/forensics.py (first NaN/Inf that matters, first divergence from the reference and the
origin of its error upstream), non-determinism from a replay of the recorded run. A NaN/Inf written
on purpose, absorbed before any output and in the reference too, is information, never an error.
A new kind is one more collector in COLLECTORS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from hardware.instructions import InstructionDriver
from hardware.program import Frame
from provenance.forensics import Finding, WithForensics
from provenance.origins import Origin, headline, trace_origin
from provenance.patterns import times
from provenance.steps import is_training


@dataclass(frozen=True)
class Problem:
    kind: str  # "race", "hang", "nan", "inf", "divergence" (at the first divergence and its origin), "nondeterminism"
    severity: str  # "error", "warning", "information"
    message: str
    tick: int
    node: str
    frames: tuple[Frame, ...]  # the user frames that made the node, outermost first


Collector = Callable[[WithForensics], Iterable[Problem]]


def first_nonfinite(session: WithForensics) -> Iterable[Problem]:
    """The first step that wrote NaN (or an Inf nobody wrote on purpose) from inputs that carried none."""
    found = session.forensics.first_nonfinite()
    if found is None:
        return []
    d = found.details
    what = "NaN" if d.filter == "nan" else "Inf"
    where = f", first at {list(d.first_index)} ({_operands_at(session, found)})" if d.first_index is not None else ""
    return [Problem(d.filter, "error", f"first {what}{_in_step(found)}: {_wrote(session, found)} {d.count} {what}"
                    f"{where}{_pattern(found)}", found.tick, found.node.name, _frames(found))]


def absorbed_births(session: WithForensics) -> Iterable[Problem]:
    """NaN/Inf written on purpose (T5's log(0) = -inf, discarded by a `where`): absorbed before any output and in
    the reference too. Information, so an editor can say where it went; never a problem."""
    f = session.forensics
    for birth in f.births():
        if f.harmless(birth):
            what = "NaN" if birth.kind == "nan" else "Inf"
            removed = (", ".join(f"{n.op_short.removeprefix('aten.')} '{n.name}' at {n.loc or 'no source line'}"
                                 for n in birth.absorbed_at) or "nothing: no node reads it")
            yield Problem(birth.kind, "information",
                          f"{birth.count} {what} written on purpose by {birth.node.op} '{birth.node.name}' at tick "
                          f"{birth.tick} (the reference has them too), removed by {removed} before any output: not "
                          "a problem", birth.tick, birth.node.name, birth.node.frames)


def first_divergence(session: WithForensics) -> Iterable[Problem]:
    """The first step where this run leaves its reference by more than the tolerance of its dtype; and, when its
    error was introduced upstream (provenance/origins.py), that origin too, where the fix belongs."""
    found = session.forensics.first_divergence()
    if found is None:
        return []
    origin, _ = trace_origin(session.forensics, found)
    upstream = f"; root cause upstream: {headline(origin, found)}" if origin else ""
    seen, made = found.observed, found.introduced
    own = (f"it introduced the error itself ({times(made.error)} tolerance when rerun on the reference's inputs)"
           if made is not None and not made.within else "the error accumulated to cross the tolerance here")
    outputs = f"; at the outputs it is {times(float(found.growth[-1]['error']))} tolerance" if found.growth else ""
    message = (f"first divergence from the reference ({session.forensics.spec}){_in_step(found)}: "
               f"{_wrote(session, found)} "
               f"{seen.mismatches} of {seen.numel} elements beyond tolerance, worst {times(seen.error)} tolerance "
               f"(max |error| {seen.max_abs:.3g}, first at {list(seen.first_mismatch or ())}); {own}{outputs}"
               f"{_pattern(found)}{upstream}")
    problems = [Problem("divergence", "error", message, found.tick, found.node.name, _frames(found))]
    if origin is not None and origin.node.loc != found.node.loc:  # on the divergence's line, its message says it
        problems.append(Problem("divergence", "error", f"root cause of the divergence at {found.node.op} "
                                f"'{found.node.name}' (tick {found.tick}): {headline(origin, found)}"
                                f"{_pattern(origin)}", origin.tick, origin.node.name, origin.node.frames))
    return problems


def nondeterminism(session: WithForensics) -> Iterable[Problem]:
    """Steps whose replay from the recorded inputs wrote different bytes than the recorded run.

    Checked on live runs only: a trace replays on whatever driver opened it, which may round differently."""
    if session.options.trace:
        return
    session.tl.replay_check()
    for found in session.tl.nondeterminism:
        node = next(n for n in session.program.nodes if n.name == found.node)
        yield Problem("nondeterminism", "warning",
                      f"non-determinism: replaying {node.op_short} '{node.name}' (tick {found.tick}) wrote a "
                      f"different '{found.value}' (digest {found.got & 0xFFFFFFFFFFFFFFFF:016x}, recorded "
                      f"{found.expected & 0xFFFFFFFFFFFFFFFF:016x}): the op is not deterministic "
                      "(random numbers, atomics or a race)", found.tick, node.name, node.frames)


def races_and_hangs(session: WithForensics) -> Iterable[Problem]:
    """The first race or the hang of each node on a many-unit chip (the sim driver), where the race and
    hang exception filters stop in the recorded schedules. None on a chip that runs whole nodes."""
    if not isinstance(session.tl.driver, InstructionDriver):
        return []
    filters, position, found = set(session.exception_filters), session.position, []
    session.set_exception_filters({"race", "hang"})
    try:
        session.goto(0)
        while (stop := session.run()).reason == "exception":
            details, node = stop.exception, session.tl.node_at(stop.tick)
            found.append(Problem(details.filter, "error", details.evidence["message"], stop.tick, node.name,
                                 node.frames))
            session.goto(stop.tick + 1)  # the next node: one problem per node
    finally:
        session.set_exception_filters(filters)
        session.goto(position)
    return found


# Most specific first: a node gets the first problem found at it (a NaN is also a divergence; a
# non-deterministic op also leaves its reference; a race makes both).
COLLECTORS: list[Collector] = [races_and_hangs, first_nonfinite, nondeterminism, first_divergence, absorbed_births]


def collect(session: WithForensics, collectors: Iterable[Collector] = COLLECTORS) -> list[Problem]:
    """Every problem of the session's run (recorded to the end first), one per node, in tick order."""
    session.forensics.record_to_end()
    found: dict[int, Problem] = {}
    for collector in collectors:
        for problem in collector(session):
            found.setdefault(problem.tick, problem)
    return sorted(found.values(), key=lambda p: p.tick)


def _in_step(found: Finding) -> str:
    """Where in a training step the finding is (` in the backward of `log` at model.py:12 (step 0)`); nothing for an
    inference pass, whose node and line say it."""
    return f" {found.where()}" if is_training(found.program) else ""


def _frames(found: Finding) -> tuple[Frame, ...]:
    """The frames an editor shows a finding at: its node's, or for an optimizer node the line making the optimizer."""
    place = found.place
    return found.node.frames or ((Frame(place),) if place is not None else ())


def _wrote(session: WithForensics, found: Finding) -> str:
    info = session.program.values[found.details.value]
    return (f"{found.node.op} '{found.node.name}' wrote '{found.details.value}' ({info.dtype}{list(info.shape)}) "
            f"at tick {found.tick} with")


def _pattern(found: Finding | Origin) -> str:
    if found.match is None:
        return ""
    m = found.match
    return f"; {m.pattern.title}: {m.reason}. Fix: {m.fix}"


def _operands_at(session: WithForensics, found: Finding) -> str:
    """Each operand's element at the first bad index (by its source name where it has one), for an
    elementwise op; else each operand's range."""
    node, details = found.node, found.details
    if torch.Tag.pointwise not in getattr(node.target, "tags", ()):
        return ", ".join(f"{n} in [{s['min']:.6g}, {s['max']:.6g}]" for n, s in details.inputs.items())
    shape = session.program.values[details.value].shape
    source = {value: name for name, value in session.source_names(found.tick).items()}
    return ", ".join(f"{_label(n, source)} = {_element(session.tensor(n, found.tick), shape, details.first_index):.6g}"
                     for n in node.input_names())


def _label(value: str, source: dict[str, str]) -> str:
    return f"{source[value]} ({value})" if value in source else value


def _element(tensor: torch.Tensor, shape: tuple[int, ...], index: tuple[int, ...]) -> float:
    return float(torch.broadcast_to(tensor, shape)[index])
