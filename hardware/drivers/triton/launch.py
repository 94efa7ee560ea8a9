"""One launch of a user's Triton kernel, read from its file: the kernel, its grid, its arguments, its reference.

A kernel file defines `kernel()` returning `(jit_function, grid, args, kwargs)` and may define `reference(*args)`
returning the expected outputs. The file is a program the user gave, so it is run (imported, its entry called)
under the Triton interpreter (TRITON_INTERPRET=1): its kernels then run on CPU tensors, operation by operation,
through the interpreter's builder, where the driver's run (run.py) takes each one as a step.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
import torch

from hardware.errors import ProgramLoadError, raised_in_user_code

KERNEL_ENTRY = "kernel"
KERNEL_RETURNS = "(jit_function, grid, args, kwargs)"
_counter = itertools.count()


def interpreter() -> ModuleType:
    """The Triton interpreter, with TRITON_INTERPRET=1 set first (a kernel decorated after it is interpreted)."""
    os.environ["TRITON_INTERPRET"] = "1"
    if _compiled_triton():
        # Triton imported before the interpreter was chosen (torch may import it) made its own jit functions (tl.sum's
        # combine) compiled ones: its Python modules are imported again, interpreted (its native library stays).
        for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
            if not name.startswith("triton._C"):
                del sys.modules[name]
    try:
        from triton.runtime import interpreter as found  # deferred: a heavy optional library (the kernels extra)
    except ImportError as exc:
        raise ProgramLoadError("the triton driver needs Triton: pip install -e '.[kernels]' (triton>=3.9); "
                               f"it could not be imported: {exc}") from None
    return found


def interpreter_refuses(dtype: torch.dtype) -> str | None:
    """Why the Triton interpreter cannot compute in `dtype`, in words (None: it can). Asked of the interpreter
    itself: 1.5 + 2.25 and 1.5 * 2.25 are exact in float16 and bfloat16 and must come out so (numpy has no
    bfloat16: Triton 3.9 keeps it as 16-bit integer words, and adds and multiplies those as integers)."""
    interp = interpreter()
    kind = {torch.float16: interp.tl.float16, torch.bfloat16: interp.tl.bfloat16}[dtype]
    b = interp.interpreter_builder
    a, c = (b.create_fp_trunc(b.get_fp32(v), kind) for v in (1.5, 2.25))
    with np.errstate(all="ignore"):
        got = [float(b.create_fp_ext(op(a, c), interp.tl.float32).data[0]) for op in (b.create_fadd, b.create_fmul)]
    if got == [3.75, 3.375]:
        return None
    name = str(dtype).removeprefix("torch.")
    return (f"the Triton interpreter does not compute in {name}: it keeps {name} values as numpy {a.data.dtype} "
            f"words, and 1.5 + 2.25 in {name} comes out {got[0]:g} under it (1.5 * 2.25: {got[1]:g}), so a run "
            f"would not say what the kernel computes in {name}")


def _compiled_triton() -> bool:
    standard = sys.modules.get("triton.language.standard")
    return standard is not None and type(standard._sum_combine).__name__ != "InterpretedFunction"


def import_kernel_file(path: str | os.PathLike) -> ModuleType:
    """Import the user's kernel file under a name of its own (it is the user's program: it runs)."""
    file = Path(path)
    if not file.is_file():
        raise ProgramLoadError(f"there is no kernel file {file}")
    interpreter()
    name = f"rewind_kernel_{file.stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(file.resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ProgramLoadError(f"importing {file} failed: {raised_in_user_code(exc, file)}") from None
    finally:
        if added:
            sys.path.remove(folder)
    return module


@dataclass
class KernelArgument:
    name: str
    value: Any  # a torch.Tensor, a number, or a constexpr's value
    constexpr: bool


class KernelLaunch:
    """The kernel of a file's `kernel()` with its grid and bound arguments; runs its programs one by one."""

    def __init__(self, file: Path, module: ModuleType, fn: Any, grid: Any, args: tuple, kwargs: dict):
        self.file, self.module = file, module
        self.interp = interpreter()
        self.function = _interpreted(self.interp, fn, file)
        self.name = self.function.fn.__name__
        signature = inspect.signature(self.function.fn)
        accepted = set(signature.parameters)
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}  # num_warps and the like are the compiler's
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ProgramLoadError(f"kernel() in {file} gives arguments {self.name}() does not take: {exc}") from None
        bound.apply_defaults()
        notes = {n: str(p.annotation) for n, p in signature.parameters.items()}
        self.arguments = [KernelArgument(n, v, "constexpr" in notes[n]) for n, v in bound.arguments.items()]
        for a in self.arguments:
            if isinstance(a.value, torch.Tensor) and a.value.device.type != "cpu":
                raise ProgramLoadError(f"argument '{a.name}' of {self.name} is on {a.value.device}: the triton driver "
                                       "runs kernels under the interpreter, on CPU tensors")
        self.grid = self._grid(grid)
        self.programs = int(np.prod(self.grid))
        self.builder = self.interp.interpreter_builder
        self.files = {self.function.fn.__code__.co_filename, str(file)}
        self.def_line = self.function.fn.__code__.co_firstlineno
        self._rewritten = self.function.rewrite()
        self._units: dict[int, int] = {}  # thread ident -> unit
        self._indices: dict[int, tuple[int, int, int]] = {}  # unit -> its grid index
        self.entry_ops: set[str] = set()  # the torch ops kernel() computed with (making the kernel's inputs)
        self.entry_lines: dict[str, int] = {}  # and the line of the file each was first called from
        self.cast: torch.dtype | None = None  # the dtype the float32 tensors were cast to (cast_inputs)

    @classmethod
    def from_file(cls, path: str | os.PathLike, sizes: dict[str, int] | None = None) -> "KernelLaunch":
        """The launch kernel(**sizes) in the file returns (sizes: the coverage suite's, by kernel()'s parameters)."""
        file = Path(path).resolve()
        module = import_kernel_file(file)
        entry = getattr(module, KERNEL_ENTRY, None)
        if not callable(entry):
            raise ProgramLoadError(f"{file} defines no '{KERNEL_ENTRY}' (the entry that returns {KERNEL_RETURNS})")
        try:
            with OpsSeen(file) as seen:
                result = entry(**(sizes or {}))
        except Exception as exc:
            raise ProgramLoadError(f"calling {KERNEL_ENTRY}() in {file} failed: {raised_in_user_code(exc, file)}") \
                from None
        if not (isinstance(result, tuple) and len(result) in (3, 4)):
            raise ProgramLoadError(f"{KERNEL_ENTRY}() in {file} must return {KERNEL_RETURNS}; got "
                                   f"{type(result).__name__}")
        fn, grid, args = result[:3]
        kwargs = result[3] if len(result) == 4 else {}
        if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
            raise ProgramLoadError(f"{KERNEL_ENTRY}() in {file} must return args as a tuple and kwargs as a dict")
        launch = cls(file, module, fn, grid, tuple(args), dict(kwargs))
        launch.entry_ops, launch.entry_lines = seen.ops, seen.lines
        return launch

    def _grid(self, grid: Any) -> tuple[int, int, int]:
        if callable(grid):
            try:
                grid = grid({a.name: a.value for a in self.arguments})
            except Exception as exc:
                raise ProgramLoadError(f"the grid function of {self.file.name} failed: "
                                       f"{raised_in_user_code(exc, self.file)}") from None
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        if not 1 <= len(grid) <= 3 or not all(isinstance(g, int) and g >= 1 for g in grid):
            raise ProgramLoadError(f"the grid of {self.name} must be 1 to 3 positive whole numbers; got {grid!r}")
        return tuple(grid) + (1,) * (3 - len(grid))

    # -- the kernel's tensors -------------------------------------------------------------------------------
    @property
    def tensors(self) -> list[KernelArgument]:
        return [a for a in self.arguments if isinstance(a.value, torch.Tensor)]

    def scale_inputs(self, factor: float) -> None:
        """Every floating tensor argument times `factor` (the coverage suite's value ranges)."""
        for a in self.arguments:
            if isinstance(a.value, torch.Tensor) and a.value.is_floating_point():
                a.value = a.value * factor

    def cast_inputs(self, dtype: torch.dtype) -> int:
        """Every float32 tensor argument as `dtype` (the coverage suite's dtype cases); how many there were. The
        reference is then given the cast tensors in float64 (forensics.py)."""
        cast = [a for a in self.arguments if isinstance(a.value, torch.Tensor) and a.value.dtype == torch.float32]
        for a in cast:
            a.value = a.value.to(dtype)
        self.cast = dtype if cast else None
        return len(cast)

    def reference(self) -> Callable | None:
        found = getattr(self.module, "reference", None)
        return found if callable(found) else None

    def call_arguments(self, owned: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The kernel's arguments as the interpreter passes them: tensors (the driver's own copies, `owned`) as
        pointers, numbers as scalars, constexprs as they are."""
        out = {}
        for a in self.arguments:
            value = owned.get(a.name, a.value)
            out[a.name] = value if a.constexpr else self.interp._implicit_cvt(value)
        return out

    # -- programs -------------------------------------------------------------------------------------------
    def program_index(self, unit: int) -> tuple[int, int, int]:
        """Unit u (1..programs) is the program of grid order u - 1 (x slowest, as the interpreter runs them)."""
        _, ny, nz = self.grid
        i = unit - 1
        return i // (ny * nz), (i // nz) % ny, i % nz

    def program_name(self, unit: int) -> str:
        x, y, z = self.program_index(unit)
        return f"program ({x}, {y}, {z})"

    def bind_thread(self, unit: int) -> None:
        self._units[threading.get_ident()] = unit

    def unit_of_thread(self) -> int:
        return self._units[threading.get_ident()]

    def select_program(self, unit: int) -> None:
        """The interpreter keeps one grid index: each step sets its program's before it runs."""
        index = self._indices.get(unit)
        if index is None:
            index = self._indices[unit] = self.program_index(unit)
        self.builder.grid_idx = index

    def run_program(self, unit: int, args: dict[str, Any]) -> None:
        self.select_program(unit)
        self._rewritten(**args)

    def kernel_frame(self, frame: Any) -> Any:
        """The frame of the kernel (or of a jit function it calls) that the operation running in `frame` is at."""
        while frame is not None:
            if frame.f_code.co_filename in self.files and frame.f_code.co_name != KERNEL_ENTRY:
                return frame
            frame = frame.f_back
        return None

    def describe_failure(self, unit: int, exc: BaseException) -> str:
        """What the program's kernel raised, at the kernel's line (a jit function the kernel called raised `exc`'s
        cause: the interpreter wraps that with its repr, a Python class name, so the words are the cause's)."""
        cause = exc
        while type(cause).__name__ == "InterpreterError" and cause.__cause__ is not None:
            cause = cause.__cause__
        where = raised_in_user_code(exc, self.file).rsplit(" (at ", 1)
        said = (str(cause).strip() or "an error without a message") + (f" (at {where[1]}" if len(where) == 2 else "")
        return f"{self.program_name(unit)} of {self.name} failed: {said}"

    # -- the interpreter, patched for a run -------------------------------------------------------------------
    def patch_language(self) -> Callable[[], None]:
        """The interpreter's tl patches (what its own launch does), and the grid's size; returns the undo."""
        self.builder.set_grid_dim(*self.grid)
        scope = self.interp._patch_lang(self.function.fn)
        return scope.restore

    def route_reductions(self, operation: Callable[[str, Callable, tuple], Any]) -> Callable[[], None]:
        """Each reduction and scan is one operation: `operation(kind, original, (ops, input))` runs it."""
        interp = self.interp
        for cls, kind in ((interp.ReduceOps, "reduce"), (interp.ScanOps, "scan")):
            cls.apply = _routed_reduction(kind, _APPLY.setdefault(cls, cls.apply), operation)

        def undo() -> None:
            for cls, original in _APPLY.items():
                cls.apply = original
        return undo

    def run_plainly(self, tensors: dict[str, torch.Tensor]) -> None:
        """The launch as Triton's own interpreter runs it, on `tensors` (by parameter, changed in place): the
        plain run the debugger's is measured against."""
        values = [tensors.get(a.name, a.value) for a in self.arguments]
        self.function.run(*values, grid=self.grid, warmup=False)

    def mask(self, lanes: np.ndarray) -> Any:
        import triton.language as tl  # deferred: a heavy optional library (the kernels extra)
        return self.interp.TensorHandle(np.ascontiguousarray(lanes, dtype=bool), tl.int1)


# Ops that make, copy, convert or view tensors: preparing a kernel's inputs with them computes nothing of its answer.
PREPARING = frozenset(("_to_copy", "copy_", "clone", "empty", "empty_like", "empty_strided", "zeros", "zeros_like",
                       "ones", "ones_like", "full", "full_like", "randn", "rand", "randint", "randperm", "arange",
                       "normal_", "uniform_", "random_", "fill_", "zero_", "detach", "alias", "lift_fresh", "view",
                       "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "contiguous", "slice",
                       "select", "unsqueeze", "squeeze", "as_strided", "split", "unbind", "set_", "resize_",
                       "scalar_tensor", "item", "_local_scalar_dense", "lift_fresh_copy"))


class OpsSeen:
    """The torch ops run while it is entered (by name: aten.softmax is `_softmax`), but for those that only prepare
    tensors (PREPARING); `lines`: the line of `file` each was first called from."""

    def __init__(self, file: Path | None = None):
        self.file = str(file) if file else None
        self.ops: set[str] = set()
        self.lines: dict[str, int] = {}

    def __enter__(self) -> "OpsSeen":
        from torch.utils._python_dispatch import TorchDispatchMode  # deferred: only a kernel's load uses it

        seen = self

        class Mode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # Nothing is compiled under this mode: without this, its first op imports torch._dynamo (3 s of a
                # kernel file's launch) to wrap __torch_dispatch__ in dynamo.disable.
                return False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._overloadpacket.__name__
                if name not in PREPARING and name not in seen.ops:
                    seen.ops.add(name)
                    frame = sys._getframe(1)
                    while frame is not None and frame.f_code.co_filename != seen.file:
                        frame = frame.f_back
                    if frame is not None:
                        seen.lines[name] = frame.f_lineno
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


_APPLY: dict[type, Callable] = {}  # the interpreter's own ReduceOps.apply and ScanOps.apply


def _routed_reduction(kind: str, original: Callable, operation: Callable) -> Callable:
    def apply(ops: Any, source: Any) -> Any:
        return operation(kind, original, (ops, source))
    return apply


def _interpreted(interp: ModuleType, fn: Any, file: Path) -> Any:
    """The InterpretedFunction of a kernel (a JITFunction made before the interpreter was asked for is
    wrapped)."""
    if isinstance(fn, interp.InterpretedFunction):
        return fn
    inner = getattr(fn, "fn", None)
    if callable(inner) and hasattr(fn, "run"):
        return interp.InterpretedFunction(inner)
    raise ProgramLoadError(f"{KERNEL_ENTRY}() in {file} must return a @triton.jit function first; got "
                           f"{type(fn).__name__}")
