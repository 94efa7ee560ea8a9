"""Forensics of a kernel launch: its outputs against the file's `reference()` (or a torch op, against.py), the wrong
elements, the program and kernel line where they first went wrong, and the kernel patterns the recorded run shows.

Everything comes from the launch's recorded run (driver.py): which program stored each element at which line and
step, what every load read, where padding lanes were counted, and the checks' findings. Patterns, most telling
first: a race between programs, an access out of bounds, padding lanes counted by a reduction (`other=0.0` where a
max needs -inf), programs whose reads start a row stride off by one apart, an input's tail never read (a loop that
drops the tail block), output elements no program writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hardware.drivers.triton.against import AgainstError, AgainstOp
from hardware.drivers.triton.driver import TritonDriver
from hardware.drivers.triton.launch import OpsSeen
from hardware.errors import RewindError, raised_in_user_code
from hardware.instructions import StepFinding

FLOAT32 = (1e-4, 1e-5)  # rtol, atol of a float32 output against a float64 reference
# A 16-bit output: ten machine epsilons relative (2**-10 for float16, 2**-7 for bfloat16) and one absolute, looser
# than torch.testing's (1e-3, 1e-5) and (1.6e-2, 1e-5), which allow one rounding of the result: a kernel rounds
# its loads, its accumulators and its store to 16 bits, and a value near zero after a cancellation keeps the
# rounding error of the unit-scale values it came from.
TOLERANCES = {torch.float16: (1e-2, 1e-3), torch.bfloat16: (8e-2, 8e-3)}
REFERENCE = "reference()"
SHOWN = 8


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """The rtol and atol an output of `dtype` is held to."""
    return TOLERANCES.get(dtype, FLOAT32)


@dataclass
class Pattern:
    kind: str  # race, out of bounds, padding counted, stride off by one, tail dropped, unwritten output
    line: int
    program: str | None
    tensor: str
    message: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "line": self.line, "program": self.program, "tensor": self.tensor,
                "message": self.message}


@dataclass
class KernelReport:
    kernel: str
    file: str
    programs: int
    checked: bool  # a reference was there to compare with
    against: str | None = None  # what it was compared with: reference(), or the op's call (torch.softmax(x_ptr))
    wrong: dict[str, dict] = field(default_factory=dict)  # output -> count, elements, worst error
    first: dict | None = None  # the first store that went wrong: program, line, step, tensor, elements
    patterns: list[Pattern] = field(default_factory=list)

    @property
    def line(self) -> int | None:
        """The kernel line the report puts the problem at."""
        if self.patterns:
            return self.patterns[0].line
        return self.first["line"] if self.first else None

    @property
    def clean(self) -> bool:
        return not self.wrong and not self.patterns

    def headline(self) -> str:
        if self.clean:
            said = "the reference" if self.against == REFERENCE else self.against
            return (f"{self.kernel}: every output matches {said} and no check fired ({self.programs} "
                    "programs)" if self.checked else f"{self.kernel}: no check fired ({self.programs} programs)")
        count = sum(w["count"] for w in self.wrong.values())
        said = f"{count} wrong output element(s); " if count else ""
        top = self.patterns[0] if self.patterns else None
        where = f"line {self.line}" + (f" ({top.kind})" if top else "")
        return f"{self.kernel}: {said}the problem is at {where}"

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "file": self.file, "programs": self.programs, "checked": self.checked,
                "against": self.against, "headline": self.headline(), "line": self.line, "clean": self.clean,
                "wrong": self.wrong, "first": self.first, "patterns": [p.to_dict() for p in self.patterns]}


def expected_outputs(driver: TritonDriver, against: AgainstOp | None = None) -> dict[str, torch.Tensor] | None:
    """The expected values of the tensors the kernel writes (in parameter order): the op `against` on the launch's
    arguments in float64, else the file's reference(*args, **kwargs), else None."""
    launch = driver.launch
    if against is not None:
        arguments = {a.name: _given(a.value, float64=True) for a in launch.arguments}
        said = against.call(inputs(driver))
        with OpsSeen() as seen:
            result = against.results(launch.name, arguments, inputs(driver),
                                     lambda found: _matched(driver, found, said, AgainstError))
        driver.reference_ops = seen.ops
        return _matched(driver, result, said, AgainstError)
    reference = launch.reference()
    if reference is None:
        return None
    values = [_given(a.value, float64=launch.cast is not None) for a in launch.arguments]
    positional = [v for a, v in zip(launch.arguments, values) if not a.constexpr]
    named = {a.name: v for a, v in zip(launch.arguments, values) if a.constexpr}
    try:
        with OpsSeen() as seen:
            result = reference(*positional, **named)
        driver.reference_ops = seen.ops
    except Exception as exc:
        raise RewindError(f"reference() in {launch.file.name} failed: {raised_in_user_code(exc, launch.file)}") \
            from None
    return _matched(driver, result, f"reference() in {launch.file.name}", RewindError)


def inputs(driver: TritonDriver) -> list[str]:
    """The tensors the kernel only reads, in parameter order."""
    written = driver.written()
    return [a.name for a in driver.launch.tensors if a.name not in written]


def _given(value: Any, float64: bool) -> Any:
    """An argument as the reference or the op is given it: a copy, floating tensors in float64 if `float64` (an op
    always; reference() in a dtype case, from the cast tensors)."""
    if not isinstance(value, torch.Tensor):
        return value
    return value.detach().double() if float64 and value.is_floating_point() else value.clone()


def _matched(driver: TritonDriver, result: Any, source: str, error: type[RewindError]) -> dict[str, torch.Tensor]:
    """`source`'s result (one tensor, or a tuple of them) as the expected value of each tensor the kernel writes
    (`error`: what a result that does not fit raises)."""
    result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    written = driver.written()
    if len(result) != len(written):
        raise error(f"{source} returns {len(result)} value(s); the kernel writes {len(written)} tensor(s) "
                    f"({', '.join(written)})")
    out = {}
    for name, tensor in zip(written, result):
        have = driver.tensor_at_end(name)
        if not isinstance(tensor, torch.Tensor):
            raise error(f"{source} gives {name} a {type(tensor).__name__}, not a tensor")
        if tensor.numel() != have.numel():
            raise error(f"{source} gives {name} a value of shape {list(tensor.shape)}; the kernel's {name} "
                        f"is {list(have.shape)}")
        out[name] = tensor.detach().reshape(have.shape)
    return out


def investigate(driver: TritonDriver, against: AgainstOp | None = None) -> KernelReport:
    launch = driver.launch
    report = KernelReport(launch.name, str(launch.file), launch.programs, False)
    expected = expected_outputs(driver, against)
    if expected is not None:
        report.checked = True
        report.against = REFERENCE if against is None else against.call(inputs(driver))
        for name, want in expected.items():
            wrong = _wrong(driver.tensor_at_end(name), want)
            if wrong is not None:
                report.wrong[name] = wrong
        report.first = _first_wrong_store(driver, expected, report.wrong) if report.wrong else None
    report.patterns = _patterns(driver, report)
    return report


def divergence(driver: TritonDriver) -> StepFinding | None:
    """The launch against its reference as a finding of the `divergence` exception filter, at the first store that
    left an output element wrong: the report's headline and its first pattern, at its line."""
    if driver.launch.reference() is None:
        return None
    report = investigate(driver)
    first = report.first
    if first is None:
        return None
    said = f": {report.patterns[0].message}" if report.patterns else ""
    message = (f"{report.headline()}{said}; the first wrong store is {first['program']}'s at line {first['line']}, "
               f"into {first['tensor']} {first['elements']}")
    detail = {"kind": "kernel against its reference", "line": report.line, "wrong": report.wrong, "first": first,
              "patterns": [p.to_dict() for p in report.patterns]}
    return StepFinding("divergence", first["step"], first["unit"], message, detail)


def _wrong(have: torch.Tensor, want: torch.Tensor) -> dict | None:
    rtol, atol = tolerance(have.dtype)
    have64, want64 = have.double().reshape(-1), want.double().reshape(-1)
    err = (have64 - want64).abs()
    bad = (err > atol + rtol * want64.abs()) | (have64.isnan() != want64.isnan())
    bad &= ~(have64.isnan() & want64.isnan())
    if not bad.any():
        return None
    idx = torch.nonzero(bad).reshape(-1)
    worst = float(torch.nan_to_num(err[bad], nan=float("inf")).max())
    return {"count": int(bad.sum()), "elements": [int(i) for i in idx[:SHOWN]], "worstError": worst}


def _first_wrong_store(driver: TritonDriver, expected: dict[str, torch.Tensor], wrong: dict) -> dict | None:
    """The earliest store that left an element of an output at a value the reference does not have (the last
    store of that element: an accumulator's earlier stores are partial on purpose)."""
    memory = driver.memory
    names = {i: t.param for i, t in enumerate(memory.tensors)}
    want = {i: expected[n].double().reshape(-1).numpy() for i, n in names.items() if n in wrong}
    last: dict[int, np.ndarray] = {}
    for acc in driver.record.log.accesses:
        if acc.kind != "load" and acc.tensor in want:
            steps = last.setdefault(acc.tensor, np.full(len(want[acc.tensor]), -1, np.int64))
            steps[acc.elements] = acc.step
    for acc in driver.record.log.accesses:
        if acc.kind == "load" or acc.tensor not in want:
            continue
        dtype = memory.tensors[acc.tensor].tensor.dtype
        rtol, atol = tolerance(dtype)
        w = want[acc.tensor][acc.elements]
        v = _float64(acc.values, dtype)
        bad = ~(np.abs(v - w) <= atol + rtol * np.abs(w)) & (last[acc.tensor][acc.elements] == acc.step)
        if bad.any():
            return {"program": driver.launch.program_name(acc.unit), "unit": acc.unit, "line": acc.line, "step": acc.step,
                    "tensor": names[acc.tensor], "elements": [int(e) for e in acc.elements[bad][:SHOWN]]}
    return None


def _float64(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Recorded values as float64 (bfloat16 is recorded as its 16-bit words: the high half of a float32)."""
    if dtype == torch.bfloat16:
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return values.astype(np.float64)


def _patterns(driver: TritonDriver, report: KernelReport) -> list[Pattern]:
    launch, log = driver.launch, driver.record.log
    out: list[Pattern] = []
    assisted = wrapper_assisted(driver)
    if assisted:
        shared = sorted(launch.entry_ops & driver.reference_ops)
        out.append(Pattern("wrapper-assisted", launch.entry_lines.get(shared[0], launch.def_line), None, "", assisted))
    for kind in ("race", "out of bounds"):
        found = [f for f in log.findings if f.kind == kind]
        if found:
            f = found[0]
            more = f" ({len(found)} such findings)" if len(found) > 1 else ""
            out.append(Pattern(kind, f.line, launch.program_name(f.unit), f.tensor, f.message + more))
    out += _padding(driver)
    out += _strides(driver)
    if report.wrong or not report.checked:
        out += _unread_tails(driver)
    out += _unwritten_outputs(driver, report)
    return out


def wrapper_assisted(driver: TritonDriver) -> str | None:
    """Why the launch is not a kernel computing its answer: kernel() computes with the op the reference computes
    with (the answer made outside the kernel, the kernel only moving it)."""
    shared = sorted(driver.launch.entry_ops & driver.reference_ops)
    if not shared:
        return None
    return (f"wrapper-assisted: kernel() in {driver.launch.file.name} computes with {', '.join(shared)}, the op(s) "
            f"the reference computes with, before {driver.launch.name} runs: the answer is made outside the kernel")


def _padding(driver: TritonDriver) -> list[Pattern]:
    log, launch = driver.record.log, driver.launch
    reached = [f for f in log.findings if f.kind == "padding reaches output"]
    if not reached:
        return []
    f = reached[0]
    loads = [p for p in log.padded_loads if p[1] == f.unit and p[0] < f.step]
    reductions = [r for r in log.padded_reductions if r[1] == f.unit and r[0] < f.step]
    if not loads:
        return [Pattern("padding reaches output", f.line, launch.program_name(f.unit), f.tensor, f.message)]
    _, _, line, other = loads[0]
    counted = ", ".join(f"the {r[3]} at line {r[2]}" for r in reductions) or "the operations after it"
    wants = "-inf (a max ignores it, and exp(-inf) = 0 adds nothing to a sum)" if any(
        r[3] in ("max", "sum") for r in reductions) else "a value the reduction ignores"
    message = (f"padding lanes included in a reduction: the masked-off lanes of the load at line {line} read "
               f"other={other:g}, and {counted} count{'s' if len(reductions) == 1 else ''} them "
               f"({launch.program_name(f.unit)} and every program with a partial block); the padding must be "
               f"{wants}")
    return [Pattern("padding counted", line, launch.program_name(f.unit), f.tensor, message)]


def _reads(driver: TritonDriver) -> dict[tuple[int, int], dict[int, np.ndarray]]:
    """(tensor, line) -> program -> the elements its loads at that line read."""
    found: dict[tuple[int, int], dict[int, list[np.ndarray]]] = {}
    for acc in driver.record.log.accesses:
        if acc.kind == "load":
            found.setdefault((acc.tensor, acc.line), {}).setdefault(acc.unit, []).append(acc.elements)
    return {k: {u: np.concatenate(v) for u, v in by.items()} for k, by in found.items()}


def _strides(driver: TritonDriver) -> list[Pattern]:
    """Programs whose reads of one tensor start a constant distance apart that is a row stride off by one."""
    out = []
    for (t, line), by in _reads(driver).items():
        tensor = driver.memory.tensors[t]
        strides = [s for s in tensor.tensor.stride() if s > 1]
        if len(by) < 3 or not strides:
            continue
        starts = np.array([int(by[u].min()) for u in sorted(by)])
        steps = set(np.diff(starts).tolist())
        if len(steps) != 1:
            continue
        step = steps.pop()
        near = [s for s in strides if abs(step - s) == 1]
        if near:
            out.append(Pattern("stride off by one", line, None, tensor.param,
                               f"the programs' loads of {tensor.param} at line {line} start {step} elements apart, "
                               f"and its rows are {near[0]} apart ({list(tensor.tensor.shape)}): a row stride or "
                               "offset off by one"))
    return out


def _unread_tails(driver: TritonDriver) -> list[Pattern]:
    """An input whose last elements along its last dimension no program ever reads (a loop that stops before
    the tail block)."""
    written = {i for i, t in enumerate(driver.memory.tensors) if t.param in driver.written()}
    out = []
    for (t, line), by in _reads(driver).items():
        if t in written:
            continue
        tensor = driver.memory.tensors[t].tensor
        read = np.zeros(tensor.numel(), bool)
        for elements in _reads(driver)[(t, line)].values():
            read[elements] = True
        if read.all() or not read.any() or tensor.dim() < 1:
            continue
        cols = tensor.shape[-1]
        grid = read.reshape(-1, cols)
        ever = grid.any(axis=0)
        tail = np.flatnonzero(~ever)
        if len(tail) and tail[-1] == cols - 1 and (tail == np.arange(tail[0], cols)).all():
            param = driver.memory.tensors[t].param
            out.append(Pattern("tail dropped", line, None, param,
                               f"no program's load at line {line} reads the last {len(tail)} of {cols} columns "
                               f"of {param} ({list(tensor.shape)}; columns {int(tail[0])}..{cols - 1}): a loop or "
                               "block count stops before the tail block (use tl.cdiv and a mask)"))
    return out


def _unwritten_outputs(driver: TritonDriver, report: KernelReport) -> list[Pattern]:
    out = []
    for name, wrong in report.wrong.items():
        t = driver._index(name)
        stored = np.zeros(driver.memory.tensors[t].tensor.numel(), bool)
        for acc in driver.record.log.accesses:
            if acc.tensor == t and acc.kind != "load":
                stored[acc.elements] = True
        never = np.flatnonzero(~stored)
        if len(never):
            out.append(Pattern("unwritten output", driver.launch.def_line, None, name,
                               f"{len(never)} element(s) of {name} no program stores ({_shown(never)}): they hold "
                               "what the tensor held before the launch"))
    return out


def _shown(values: Any) -> str:
    values = list(values)
    return ", ".join(str(int(v)) for v in values[:6]) + (f", … {len(values)} in all" if len(values) > 6 else "")
