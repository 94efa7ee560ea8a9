"""The reference: a known-good pass's value of every node, to compare this pass with.

A reference spec is one of
- a driver, `torch:cpu:float64`: the same Program runs again through its own Timeline on that
  driver, every floating op in float64 and casts to lower precision made no-ops (the torch
  driver's compute precision): the same engine, not a second one. It is a shadow of the program: each
  node runs at the reference precision on the reference's own inputs, whatever dtypes the program
  casts to (`.half()`, `.to(dtype)`, autocast's casts are the identity there), and parameters and
  buffers are taken at the reference precision once. A training run of several steps is compared
  step by step from the same state (`per_step`): the reference of step k reads the values earlier
  steps left (parameters, optimizer state, buffers) as the program computed them, so what it finds
  in step k was introduced in step k; the free-running reference's trajectory is another question
  (`trajectory`);
- a trace of an earlier run (checkpoint/trace.py), read without a device;
- a file of saved values written by `save_values` (torch.save of value name -> tensor).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from checkpoint.recording import open_trace
from checkpoint.safe_files import atomic_write, check_target
from checkpoint.timeline import Timeline
from checkpoint.trace import MAGIC
from hardware.driver import HostValues, capabilities, cast, to_host
from hardware.drivers import open_driver, trace_driver
from hardware.errors import DriverError, RewindError
from hardware.program import Node, Program, ValueInfo, renamed_refs
from hardware.torch_tensors import COLLECTIVES
from provenance.births import Birth, births

DEFAULT_REFERENCE = "torch:cpu:float64"
VALUES_FORMAT = "rewind-values/1"
Progress = Callable[[int, int], None]
Collectives = Callable[[Node, Callable[[], list[Any]]], list[Any]]  # how a collective node runs (COLLECTIVES)


class Reference:
    """Values of the known-good pass by Program value name, as host tensors."""

    def __init__(self, spec: str, program: Program, value_of: Callable[[str], torch.Tensor | None],
                 timeline: Timeline | None = None):
        self.spec = spec
        self.program = program
        self._value_of = value_of
        self._timeline = timeline  # the pass's own, where it ran or was recorded (saved values have none)
        self.collectives: Collectives | None = None  # how its pass runs a collective node (open_reference)

    @property
    def timeline(self) -> Timeline | None:
        """The pass's own Timeline (None for saved values)."""
        return self._timeline

    def births(self) -> list[Birth] | None:
        """The reference pass's NaN/Inf births (provenance/births.py); None for saved values, which keep no pass."""
        with running(self.collectives):
            return None if self._timeline is None else births(self._timeline, self._timeline.program)

    def value(self, name: str) -> torch.Tensor:
        with running(self.collectives):  # a value the ring evicted is recomputed by the pass
            tensor = self._value_of(name)
        if tensor is None:
            raise RewindError(f"the reference {self.spec} has no value '{name}'")
        return tensor


def open_reference(spec: str, program: Program, budget: int, progress: Progress | None = None,
                   collectives: Collectives | None = None,
                   carried: Callable[[str], torch.Tensor] | None = None) -> Reference:
    """`collectives`: how a driver's pass runs a collective node (one rank's reference pass runs each with its peers'
    reference passes: hardware/ranks/forensics.py), held while the pass runs and while its values are read.
    `carried`: the program's own value of a name (a host tensor), for a driver's pass of several training steps to
    start each step from (`per_step`); None: the reference follows its own trajectory."""
    if spec.startswith("torch:"):
        with running(collectives):
            reference = _pass_reference(spec, per_step(program, carried) if carried else program, budget, progress)
            reference.program = program
        reference.collectives = collectives
        return reference
    path = Path(spec)
    if not path.is_file():
        raise RewindError(f"reference '{spec}' is neither a driver (e.g. {DEFAULT_REFERENCE}) nor a file")
    with path.open("rb") as f:
        is_trace = f.read(len(MAGIC)) == MAGIC
    return _trace_reference(spec, program, budget) if is_trace else _saved_reference(spec, program)


def check_spec(spec: str) -> None:
    """Refuse, in words, a reference that names no driver this machine has and no file (before any pass runs)."""
    if spec.startswith("torch:"):
        try:
            open_driver(spec)
        except DriverError as exc:
            raise RewindError(f"reference '{spec}': {exc}") from None
    elif not Path(spec).is_file():
        raise RewindError(f"reference '{spec}' is neither a driver (e.g. {DEFAULT_REFERENCE}) nor a file")


@contextmanager
def running(collectives: Collectives | None) -> Iterator[None]:
    """Collective nodes run by `collectives` inside (None: as they run outside)."""
    if collectives is None:
        yield
        return
    token = COLLECTIVES.set(collectives)
    try:
        yield
    finally:
        COLLECTIVES.reset(token)


def _pass_reference(spec: str, program: Program, budget: int, progress: Progress | None) -> Reference:
    try:
        driver = open_driver(spec)
    except DriverError as exc:
        raise RewindError(f"reference '{spec}': {exc}") from None
    timeline = Timeline(program, driver, budget)
    chunk = max(1, timeline.end // 50)
    for tick in range(0, timeline.end, chunk):
        timeline.seek(tick)
        if progress:
            progress(tick, timeline.end)
    timeline.seek(timeline.end)
    return _timeline_reference(spec, program, timeline)


CARRIED = "{}@carried"  # the program's own value of an earlier step's result, read by a later step's reference


def per_step(program: Program, carried: Callable[[str], torch.Tensor]) -> Program:
    """`program` with every read of a value an earlier training step wrote made a read of a constant holding the
    program's own value of it (`carried`): the reference of each step starts from the state the program had
    there. The same nodes, under the same names; one step (or an inference pass) is `program` itself."""
    if len(program.step_starts) < 2:
        return program
    values, initial = dict(program.values), dict(program.initial)
    nodes = []
    for node in program.nodes:
        earlier = {n: CARRIED.format(n) for n in node.input_names() if _written_before(program, n, node.step)}
        for name, alias in earlier.items():
            if alias not in values:
                info = program.values[name]
                values[alias] = ValueInfo(alias, "constant", info.dtype, info.shape)
                initial[alias] = carried(name)
        nodes.append(replace(node, args=renamed_refs(node.args, earlier), kwargs=renamed_refs(node.kwargs, earlier))
                     if earlier else node)
    return replace(program, nodes=nodes, values={n: replace(v, last_use=-1) for n, v in values.items()},
                   initial=initial)


def _written_before(program: Program, name: str, step: int) -> bool:
    producer = program.values[name].producer
    return producer is not None and program.nodes[producer].step < step


def _trace_reference(spec: str, program: Program, budget: int) -> Reference:
    recorded, timeline, _ = open_trace(spec, lambda p, d, archive: Timeline(p, d, budget, archive=archive),
                                       trace_driver)
    _check_same_program(spec, program, recorded.values)
    return _timeline_reference(spec, program, timeline)


def _timeline_reference(spec: str, program: Program, timeline: Timeline) -> Reference:
    def value_of(name: str) -> torch.Tensor | None:
        info = program.values.get(name)
        # Nodes read inputs, parameters and buffers as they were at the start (a graph's buffer
        # mutations are outputs), and every other value has a single version.
        position = 0 if info is not None and info.producer is None else timeline.end
        if timeline.version_at(name, position) is None:
            return None
        tensor = timeline.value(name, position)
        if position == 0 and info is not None and HostValues in capabilities(timeline.driver):  # a wider pass widens the Program's tensors where nodes read them
            tensor = cast(timeline.driver, tensor, info.dtype)
        return to_host(timeline.driver, tensor)

    return Reference(spec, program, value_of, timeline)


def _saved_reference(spec: str, program: Program) -> Reference:
    try:
        saved = torch.load(spec, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise RewindError(f"reference '{spec}' is not a trace and cannot be read as saved values: {exc}") from None
    if not isinstance(saved, dict) or saved.get("format") != VALUES_FORMAT or not isinstance(saved.get("values"), dict):
        raise RewindError(f"reference '{spec}' is not a file of saved values (format {VALUES_FORMAT})")
    values: dict[str, torch.Tensor] = saved["values"]
    _check_same_program(spec, program, {n: t for n, t in values.items()})

    def value_of(name: str) -> torch.Tensor | None:
        found = values.get(name)
        return found if found is not None else program.initial.get(name)

    return Reference(spec, program, value_of)


def _check_same_program(spec: str, program: Program, recorded: dict) -> None:
    for name, other in recorded.items():
        mine = program.values.get(name)
        shape = tuple(other.shape)
        if mine is None or mine.shape != shape:
            what = "no such value" if mine is None else f"shape {list(mine.shape)}"
            raise RewindError(f"reference '{spec}' records another program: its '{name}' has shape {list(shape)}, "
                              f"this program has {what}")


def save_values(reference: Reference, path: str, overwrite: bool = False) -> int:
    """Save the reference's value of every node output, to be a reference for later runs (no recomputation).
    The file appears whole or not at all; an existing file is replaced only with `overwrite`
    (checkpoint/safe_files.py)."""
    program = reference.program
    check_target(path, overwrite)  # before computing every value: a refusal costs nothing
    values = {info.name: reference.value(info.name).clone() for info in program.values.values()
              if info.producer is not None}
    with atomic_write(path, overwrite) as f:
        torch.save({"format": VALUES_FORMAT, "program": program.name, "values": values}, f)
    return len(values)
