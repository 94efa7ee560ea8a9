"""One run of a kernel launch under the Triton interpreter, program by program and operation by operation.

Each program instance runs in a thread of its own, but only the one holding the baton runs: every operation
passes through the interpreter's builder (patched for the run), which asks whose turn the step is, so a recorded
interleaving (or one a user forces with singleThread) replays exactly. The default policy runs a program until it
finishes, then the next in grid order: one handoff per program. A run may start at a quiescent step (no program
half-way) with the kernel's tensors as they were there: that is how a replay starts from a checkpoint.

The first run of a launch records every load, store and atomic (an Access of elements of a KernelTensor) and the
findings made as they happen: out-of-bounds lanes, padding reaching an output, races between programs.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hardware.drivers.triton import padding
from hardware.drivers.triton.launch import KernelLaunch
from hardware.drivers.triton.memory import ElementHistory, KernelMemory, Resolved
from hardware.errors import DriverError

MAX_FINDINGS = 32  # per kind: the first ones are the ones to fix


@dataclass(frozen=True)
class Access:
    step: int
    unit: int
    kind: str  # load, store, atomic
    tensor: int
    elements: np.ndarray  # int64 element offsets of the active, in-bounds lanes
    values: np.ndarray  # what was loaded there, or what the element holds after the store
    line: int


@dataclass(frozen=True)
class Finding:
    kind: str  # "out of bounds", "padding reaches output", "race", "unwritten read"
    step: int
    unit: int
    line: int
    tensor: str
    elements: tuple[int, ...]
    message: str
    other: tuple[int, int, int] | None = None  # a race's first side: (unit, step, line)
    race: str = ""  # a race's kind: write-write, read-write, write-read


@dataclass(frozen=True)
class Edit:
    """A user's write into a kernel tensor while stopped inside the launch, applied before step `step`."""

    step: int
    tensor: int
    offset: int  # bytes from the tensor's first element
    data: bytes


@dataclass
class Operation:
    said: str | tuple  # the text, or (builder op, result shape) made into one when asked (most are never shown)
    line: int

    @property
    def text(self) -> str:
        if isinstance(self.said, tuple):
            name, shape = self.said
            op = name[len("create_"):] if name.startswith("create_") else name
            self.said = f"{op} {list(shape)}" if len(shape) and int(np.prod(shape)) > 1 else op
        return self.said


@dataclass
class RunLog:
    """What a run did: the unit and pc of every step, each unit's operations, accesses and findings."""

    units: list[int] = field(default_factory=list)
    pcs: list[int] = field(default_factory=list)
    ops: dict[int, list[Operation]] = field(default_factory=dict)
    accesses: list[Access] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    padded_loads: list[tuple[int, int, int, float | None]] = field(default_factory=list)  # (step, unit, line, other)
    padded_reductions: list[tuple[int, int, int, str]] = field(default_factory=list)  # (step, unit, line, combine)


class _Stopped(BaseException):
    """A program thread of a run that was closed: unwind it (not an Exception: the kernel's code must not catch
    it)."""


class _ScheduleBroken(Exception):
    pass


class ProgramRun:
    def __init__(self, launch: KernelLaunch, memory: KernelMemory, prefix: np.ndarray | None = None,
                 edits: tuple[Edit, ...] = (), start: int = 0, done: frozenset[int] = frozenset(),
                 record: bool = True):
        """`prefix`: unit ids of the steps from `start` on (then the policy); `done`: the programs finished before
        `start`; `record`: keep accesses and findings (the first run)."""
        self.launch, self.memory = launch, memory
        self.prefix, self.start, self.recording = prefix, start, record
        self.edits = {e.step: e for e in edits}
        self.log = RunLog()
        self.history = ElementHistory(memory) if record else None
        n = launch.programs
        self.finished = [False] * (n + 1)
        for unit in done:
            self.finished[unit] = True
        self.started = [False] * (n + 1)
        self.pc = [0] * (n + 1)
        self.pending: dict[int, str] = {}  # unit -> the operation it waits to run
        self.frames: dict[int, Any] = {}  # unit -> its kernel frame at its pending operation
        self._wake = [threading.Semaphore(0) for _ in range(n + 1)]
        self._main = threading.Semaphore(0)
        self._next_unfinished = 1
        self.steps = start  # the step the run is at (steps of the launch, from its first)
        self.until: int | None = None
        self.paused: int | None = None
        self.done = False
        self.closed = False
        self.error: str | None = None
        self._depth = 0
        self.reducing = False
        self._args = launch.call_arguments(memory.owned())
        self._undo: Callable[[], None] | None = None

    # -- driving the run (the session's worker thread) ---------------------------------------------------
    def run(self, until: int | None = None) -> None:
        """Run until step `until` is about to run (None: to the end)."""
        self.until = until
        if self.done or (until is not None and self.steps >= until):
            return
        if self._undo is None:
            self._undo = _install(self)
        if self.paused is not None:
            unit, self.paused = self.paused, None
            self._wake[unit].release()
        else:
            unit = self._pick(self.steps)
            if unit is None:
                self.done = True
            else:
                self._give(unit)
        if not self.done:
            self._main.acquire()
        if self.done:
            self._unpatch()
        if self.error:
            self.close()
            raise DriverError(self.error)

    def close(self) -> None:
        """Unwind every program thread still waiting (a run opened for inspection and left)."""
        if self.closed:
            return
        self.closed = True
        for unit, started in enumerate(self.started):
            if started and not self.finished[unit]:
                self._wake[unit].release()
        self._unpatch()

    def _unpatch(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    # -- whose turn --------------------------------------------------------------------------------------
    def _pick(self, step: int) -> int | None:
        k = step - self.start
        if self.prefix is not None and k < len(self.prefix):
            unit = int(self.prefix[k])
            if self.finished[unit]:
                raise _ScheduleBroken(f"{self.launch.program_name(unit)} has finished before step {step}")
            return unit
        units = self.log.units
        if units and not self.finished[units[-1]]:
            return units[-1]
        while self._next_unfinished <= self.launch.programs and self.finished[self._next_unfinished]:
            self._next_unfinished += 1
        return self._next_unfinished if self._next_unfinished <= self.launch.programs else None

    def _give(self, unit: int) -> None:
        if self.started[unit]:
            self._wake[unit].release()
            return
        self.started[unit] = True
        threading.Thread(target=self._program, args=(unit,), daemon=True,
                         name=f"rewind {self.launch.program_name(unit)}").start()

    def _program(self, unit: int | None) -> None:
        """A program thread: it runs its program, then the next one not started yet (no thread started, no handoff,
        for each program of the default order)."""
        while unit is not None:
            self.launch.bind_thread(unit)
            try:
                self.launch.run_program(unit, self._args)
            except _Stopped:
                return
            except _ScheduleBroken as exc:
                self.error = f"the recorded interleaving cannot be replayed: {exc}"
            except DriverError as exc:
                self.error = str(exc)
            except Exception as exc:  # the user's kernel raised: the run ends, naming the program and line
                self.error = self.launch.describe_failure(unit, exc)
            self.finished[unit] = True
            self.pending.pop(unit, None)
            self.frames.pop(unit, None)
            if self.closed:
                return
            unit = self._pass_on()

    def _pass_on(self) -> int | None:
        """A program finished: the next one takes the baton (returned when it has not started: the finished one's
        thread runs it), or the run is over (or has reached `until`)."""
        if self.error:
            self.done = True
            self._main.release()
            return None
        try:
            unit = self._pick(self.steps)
        except _ScheduleBroken as exc:
            self.error, self.done = f"the recorded interleaving cannot be replayed: {exc}", True
            self._main.release()
            return None
        if unit is None:
            self.done = True
            self._main.release()
        elif self.until is not None and self.steps >= self.until:
            self._main.release()
        elif not self.started[unit]:
            self.started[unit] = True
            return unit
        else:
            self._wake[unit].release()
        return None

    def _enter(self, unit: int, op: str, frame: Any) -> int:
        """Wait for `unit`'s turn to run `op`; the step it runs."""
        self.pending[unit] = op
        self.frames[unit] = frame
        while True:
            if self.closed:
                raise _Stopped()
            step = self.steps
            if self.until is not None and step >= self.until:
                self.paused = unit
                self._main.release()
                self._wake[unit].acquire()
                continue
            turn = self._pick(step)
            if turn == unit:
                self.pending.pop(unit, None)
                self._apply_edit(step)
                return step
            self._give(turn)
            self._wake[unit].acquire()

    def _apply_edit(self, step: int) -> None:
        edit = self.edits.get(step)
        if edit is not None:
            self.memory.write(edit.tensor, edit.offset, edit.data)

    # -- one operation (a program thread) ------------------------------------------------------------------
    def operation(self, name: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        if self._depth:  # an operation the interpreter builds from others is one step
            return original(*args, **kwargs)
        unit = self.launch.unit_of_thread()
        frame = self.launch.kernel_frame(sys._getframe(1))
        step = self._enter(unit, name, frame)
        self._depth += 1
        try:
            line = frame.f_lineno if frame is not None else self.launch.def_line
            self.launch.select_program(unit)
            result, text = _MEMORY.get(name, _compute)(self, step, unit, line, name, original, args, kwargs)
        finally:
            self._depth -= 1
        self._record(unit, text, line)
        return result

    def _record(self, unit: int, text: str | tuple, line: int) -> None:
        log = self.log
        ops = log.ops.setdefault(unit, [])
        if self.pc[unit] >= len(ops):
            ops.append(Operation(text, line))
        log.units.append(unit)
        log.pcs.append(self.pc[unit])
        self.pc[unit] += 1
        self.steps += 1

    # -- memory accesses -------------------------------------------------------------------------------------
    def access(self, step: int, unit: int, line: int, kind: str, pointers: np.ndarray, active: np.ndarray
               ) -> tuple[Resolved, np.ndarray]:
        """Check an access; returns where it lands and the lanes that may be performed (active and inside a
        tensor: a lane outside every tensor is never performed, it is a finding)."""
        where = self.memory.resolve(pointers)
        active = np.broadcast_to(active, where.tensor.shape)
        outside = active & where.outside
        if outside.any() and self.recording:
            self._out_of_bounds(step, unit, line, kind, outside)
        return where, active & ~where.outside

    def recorded(self, step: int, unit: int, line: int, kind: str, where: Resolved, safe: np.ndarray) -> None:
        """Record the access just performed: per tensor, its elements and their values (loaded, or held after)."""
        if not self.recording:
            return
        for t in np.unique(where.tensor[safe]):
            t = int(t)
            elements = where.element[safe & (where.tensor == t)]
            self._touch(step, unit, line, kind, t, elements)
            values = self.memory.tensors[t].flat()[elements].copy()
            self.log.accesses.append(Access(step, unit, kind, t, elements, values, line))

    def _touch(self, step: int, unit: int, line: int, kind: str, tensor: int, elements: np.ndarray) -> None:
        writes, atomic = kind != "load", kind == "atomic"
        for race_kind, first_unit, first_step, element in self.history.conflicts(tensor, elements, unit, writes,
                                                                                 atomic):
            self._race(step, unit, line, race_kind, tensor, element, first_unit, first_step)
        self.history.record(tensor, elements, unit, step, writes, atomic)
        if atomic:
            self.history.record(tensor, elements, unit, step, False, True)

    def _race(self, step, unit, line, kind, tensor, element, first_unit, first_step) -> None:
        first_line = self._line_of(first_unit, first_step)
        name = self.memory.tensors[tensor].param
        launch = self.launch
        message = (f"race on {name}[{element}] ({kind}): {launch.program_name(first_unit)} at line {first_line} "
                   f"and {launch.program_name(unit)} at line {line} touch it with no atomic, and programs run in "
                   "no set order")
        self._find(Finding("race", step, unit, line, name, (element,), message, (first_unit, first_step, first_line),
                           kind))

    def _line_of(self, unit: int, step: int) -> int:
        pc = self.log.pcs[step - self.start]
        return self.log.ops[unit][pc].line

    def _out_of_bounds(self, step, unit, line, kind, outside: np.ndarray) -> None:
        lanes = np.flatnonzero(outside.reshape(-1))
        message = (f"{self.launch.program_name(unit)} {kind}s {len(lanes)} lane(s) outside every tensor at line "
                   f"{line} (lanes {_lanes(lanes)}), with no mask covering them: they are not performed")
        self._find(Finding("out of bounds", step, unit, line, "", tuple(int(i) for i in lanes[:8]), message))

    def padding_reaches(self, step, unit, line, where: Resolved, lanes: np.ndarray) -> None:
        if not self.recording:
            return
        t = int(where.tensor[lanes].reshape(-1)[0])
        name = self.memory.tensors[t].param
        elements = where.element[lanes & (where.tensor == t)]
        source = next((p for p in reversed(self.log.padded_loads) if p[1] == unit), None)
        origin = f" (the load at line {source[2]} pads with {source[3]:g})" if source else ""
        message = (f"{self.launch.program_name(unit)} stores into {name} at line {line} {len(elements)} element(s) "
                   f"({_lanes(elements)}) that a masked-off lane's `other` value decided{origin}: the padding "
                   "reaches the output")
        self._find(Finding("padding reaches output", step, unit, line, name, tuple(int(e) for e in elements[:8]),
                           message))

    def unwritten_reads(self) -> None:
        """After the run: loads of elements of a tensor the kernel writes that no program ever wrote (what the
        tensor held before the launch, never the kernel's)."""
        history = self.history
        written = {t for t in range(len(self.memory.tensors)) if history.written(t)}
        for acc in self.log.accesses:
            if acc.kind != "load" or acc.tensor not in written:
                continue
            never = acc.elements[history.writer[acc.tensor][acc.elements] < 0]
            if len(never):
                name = self.memory.tensors[acc.tensor].param
                message = (f"{self.launch.program_name(acc.unit)} reads {len(never)} element(s) of {name} at line "
                           f"{acc.line} ({_lanes(never)}) that no program of the launch writes: it reads what {name} "
                           "held before the kernel ran")
                self._find(Finding("unwritten read", acc.step, acc.unit, acc.line, name,
                                   tuple(int(e) for e in never[:8]), message))

    def _find(self, finding: Finding) -> None:
        if sum(f.kind == finding.kind for f in self.log.findings) < MAX_FINDINGS:
            self.log.findings.append(finding)

    def memory_name(self, where: Resolved, safe: np.ndarray) -> str:
        touched = np.unique(where.tensor[safe])
        return ", ".join(self.memory.tensors[int(t)].param for t in touched) or "(no tensor)"


def _lanes(values: np.ndarray) -> str:
    shown = ", ".join(str(int(v)) for v in values[:6])
    return shown + (f", … {len(values)} in all" if len(values) > 6 else "")


# -- the operations ---------------------------------------------------------------------------------------
def _compute(run: ProgramRun, step, unit, line, name, original, args, kwargs):
    result = original(*args, **kwargs)
    padding.propagate(name, args, result)
    return result, _op_text(name, result)


def _op_text(name: str, result: Any) -> tuple:
    data = getattr(result, "data", None)
    if data is None:
        data = getattr(getattr(result, "handle", None), "data", None)
    if data is None and isinstance(result, tuple) and result and hasattr(result[0], "handle"):
        data = result[0].handle.data
    return name, (np.shape(data) if data is not None else ())


# Where each memory builder op takes its pointers, the mask and `other` (a load) or the value (a store).
_LOAD_ARGS = {"create_load": (0, None, None), "create_atomic_load": (0, 1, None), "create_masked_load": (0, 1, 2)}
_STORE_ARGS = {"create_store": (0, 1, None), "create_atomic_store": (0, 1, 2), "create_masked_store": (0, 1, 2)}


def _picked(args: tuple, places: tuple) -> tuple:
    return tuple(None if i is None else args[i] for i in places)


def _active(ptrs: Any, mask: Any) -> np.ndarray:
    return np.ones(np.shape(ptrs.data), bool) if mask is None else np.asarray(mask.data, bool)


def _said(kind: str, run: ProgramRun, where: Resolved, safe: np.ndarray, active: np.ndarray) -> str:
    return f"{kind} {run.memory_name(where, safe)} ({active.size} lanes, {int(active.sum())} on)"


def _load(run: ProgramRun, step, unit, line, name, original, args, kwargs):
    ptrs, mask, other = _picked(args, _LOAD_ARGS[name])
    active = _active(ptrs, mask)
    where, safe = run.access(step, unit, line, "load", ptrs.data, active)
    result = _ORIGINAL["create_masked_load"](ptrs, run.launch.mask(safe), other, None, False)
    run.recorded(step, unit, line, "load", where, safe)
    unread = ~np.broadcast_to(safe, np.shape(result.data))
    if unread.any() and run.recording:  # the padding value: `other` at the first lane not read (0 without one)
        pad = float(np.broadcast_to(other.data, unread.shape)[unread][0]) if other is not None else 0.0
        run.log.padded_loads.append((step, unit, line, pad))
    padding.mark(result, unread | np.broadcast_to(padding.lanes(ptrs), unread.shape))
    return result, _said("load", run, where, safe, active)


def _store(run: ProgramRun, step, unit, line, name, original, args, kwargs):
    ptrs, value, mask = _picked(args, _STORE_ARGS[name])
    active = _active(ptrs, mask)
    where, safe = run.access(step, unit, line, "store", ptrs.data, active)
    decided = np.broadcast_to(padding.lanes(value), safe.shape) & safe
    if decided.any():
        run.padding_reaches(step, unit, line, where, decided)
    result = _ORIGINAL["create_masked_store"](ptrs, value, run.launch.mask(safe), None)
    run.recorded(step, unit, line, "store", where, safe)
    return result, _said("store", run, where, safe, active)


def _atomic_rmw(run: ProgramRun, step, unit, line, name, original, args, kwargs):
    rmw, ptrs, value, mask = args[0], args[1], args[2], args[3]
    active = np.asarray(mask.data, bool)
    where, safe = run.access(step, unit, line, "atomic", ptrs.data, active)
    result = original(rmw, ptrs, value, run.launch.mask(safe), *args[4:], **kwargs)
    run.recorded(step, unit, line, "atomic", where, safe)
    return result, _said(f"atomic_{str(rmw).split('.')[-1].lower()}", run, where, safe, active)


def _atomic_cas(run: ProgramRun, step, unit, line, name, original, args, kwargs):
    ptrs = args[0]
    where, safe = run.access(step, unit, line, "atomic", ptrs.data, np.ones(np.shape(ptrs.data), bool))
    if not safe.all():
        raise DriverError(f"{run.launch.program_name(unit)}: atomic_cas at line {line} reaches outside every tensor")
    result = original(*args, **kwargs)
    run.recorded(step, unit, line, "atomic", where, safe)
    return result, f"atomic_cas {run.memory_name(where, safe)}"


def _unsupported(run: ProgramRun, step, unit, line, name, original, args, kwargs):
    raise DriverError(f"the triton driver does not run {name[len('create_'):]} (at line {line}): tensor descriptors "
                      "and polling loads are not recorded yet")


_MEMORY: dict[str, Callable] = {
    "create_load": _load, "create_masked_load": _load, "create_atomic_load": _load,
    "create_store": _store, "create_masked_store": _store, "create_atomic_store": _store,
    "create_atomic_rmw": _atomic_rmw, "create_atomic_cas": _atomic_cas,
    "create_descriptor_load": _unsupported, "create_descriptor_store": _unsupported,
    "create_descriptor_gather": _unsupported, "create_descriptor_scatter": _unsupported,
    "create_atomic_poll": _unsupported,
}
_ORIGINAL: dict[str, Callable] = {}
_routing: ProgramRun | None = None  # the run the interpreter's operations are routed to


# -- patching the interpreter for a run --------------------------------------------------------------------
def _install(run: ProgramRun) -> Callable[[], None]:
    """Route every builder operation and reduction of the interpreter through `run`; returns the undo. The
    interpreter is one per process: a run of another launch still parked there is closed first."""
    global _routing
    if _routing is not None and _routing is not run:
        _routing.close()
    _routing = run
    builder = run.launch.builder
    names = [n for n in dir(type(builder)) if n.startswith("create_") and callable(getattr(builder, n))]
    for n in names:
        _ORIGINAL.setdefault(n, getattr(type(builder), n).__get__(builder))
        setattr(builder, n, _routed(run, n, _ORIGINAL[n]))
    undo_reduce = run.launch.route_reductions(lambda kind, original, args: run.operation(
        f"{kind} {_combined(args[0])}", lambda *a: _reduced(run, kind, original, a), args, {}))
    undo_lang = run.launch.patch_language()

    def undo() -> None:
        for n in names:
            builder.__dict__.pop(n, None)
        undo_reduce()
        undo_lang()
    return undo


def _routed(run: ProgramRun, name: str, original: Callable) -> Callable:
    return lambda *args, **kwargs: run.operation(name, original, args, kwargs)


def _combined(ops: Any) -> str:
    name = getattr(getattr(ops.combine_fn, "fn", ops.combine_fn), "__name__", "combine")
    for known in ("argmax", "argmin", "sum", "max", "min"):
        if known in name:
            return known
    return name


def _reduced(run: ProgramRun, kind: str, original: Callable, args: tuple) -> Any:
    ops, source = args[0], args[1]
    if run.reducing:  # the interpreter's apply calling itself on a tuple of one: the same reduction
        return original(ops, source)
    run.reducing = True
    try:
        result = original(ops, source)
    finally:
        run.reducing = False
    first = source[0] if isinstance(source, tuple) else source
    out = result[0] if isinstance(result, tuple) else result
    if kind == "reduce":
        counted = padding.reduce(ops.combine_fn, first.handle, out.handle, ops.axis, getattr(ops, "keep_dims", False))
        if counted and run.recording:
            unit = run.launch.unit_of_thread()
            frame = run.frames.get(unit)
            run.log.padded_reductions.append((run.steps, unit, frame.f_lineno if frame else run.launch.def_line,
                                              _combined(ops)))
    else:
        padding.mark(out.handle, padding.of(first.handle))
    return result
