"""Integrity of a fix: it must compute its outputs from its inputs, not fetch the reference's.

A fix that reads the reference pass's values (from the engine, a saved reference file, or by
walking the interpreter's objects and frames to them) or runs the reference implementation (the
engine's reference pass, or the program's own model code) instead of computing would validate
without fixing anything. Two checks keep it out:

- the source: every module a fix's functions come from is read before anything runs; imports of
  the engine or of introspection and loading modules, calls of eval/exec/open, and attributes that
  reach frames, closures and globals are refused;
- the calls: while a fix's code runs (its module body and each call of its functions), every call
  it makes, directly or through other code, is audited (sys.setprofile on the worker thread):
  none may enter the engine's packages, the program's own source files, file or pickle loaders,
  or the builtins that reach other objects and frames. The first one aborts the fix.

Validation also runs the patched pass on each generated input set before that set's reference
exists (provenance/validation.py), so there is nothing to copy there.
"""

from __future__ import annotations

import ast
import builtins
import gc
import io
import marshal
import pickle
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from hardware.errors import RewindError

ROOT = Path(__file__).resolve().parent.parent
ENGINE_PACKAGES = ("hardware", "checkpoint", "provenance", "dap_server")
# Modules whose import already says the fix does more than compute.
REFUSED_MODULES = frozenset(ENGINE_PACKAGES) | {"gc", "inspect", "sys", "pickle", "marshal", "shelve", "ctypes",
                                                "importlib", "os", "io", "builtins", "subprocess", "socket",
                                                "pathlib", "shutil", "tempfile", "types", "dill", "joblib",
                                                "threading", "multiprocessing", "concurrent", "asyncio"}
REFUSED_CALLS = frozenset({"open", "eval", "exec", "compile", "__import__", "globals", "locals", "vars",
                           "breakpoint", "input"})
# Attributes that load saved data or reach frames, closures, globals and other objects.
REFUSED_ATTRIBUTES = frozenset({"load", "loads", "from_file", "__globals__", "__closure__", "__code__",
                                "__builtins__", "__dict__", "__subclasses__", "__traceback__", "__self__",
                                "__reduce__", "__reduce_ex__", "f_back", "f_locals", "f_globals", "f_code",
                                "tb_frame", "tb_next", "gi_frame", "cr_frame", "cell_contents", "_getframe",
                                "_current_frames"})
_REFUSED_BUILTINS = {id(f): f"{getattr(f, '__module__', None) or 'builtins'}.{f.__name__}" for f in (
    gc.get_objects, gc.get_referrers, gc.get_referents, sys._getframe, sys._current_frames, sys.exc_info,
    builtins.open, io.open, builtins.eval, builtins.exec, builtins.compile, builtins.__import__, builtins.globals,
    builtins.locals, builtins.vars, pickle.loads, pickle.load, marshal.loads, marshal.load)}
REFUSED = "the integrity check refused the fix"
_LOADER_FILES = ("torch/serialization.py", "/pickle.py", "/inspect.py", "npyio", "/shelve.py", "/copyreg.py")


@dataclass(frozen=True)
class Violation:
    check: str  # "source" or "call"
    what: str
    file: str
    line: int | None

    def to_dict(self) -> dict:
        return {"check": self.check, "what": self.what, "file": self.file, "line": self.line}


class IntegrityError(RewindError):
    """A fix reached for what it must compute."""


def scan_source(text: str, file: str) -> list[Violation]:
    """What the source of a fix's module reaches for, before it runs."""
    try:
        tree = ast.parse(text, file)
    except SyntaxError as exc:
        return [Violation("source", f"does not parse: {exc.msg}", file, exc.lineno)]
    found = []
    for node in ast.walk(tree):
        what = _refused(node)
        if what:
            found.append(Violation("source", what, file, getattr(node, "lineno", None)))
    return found


def _refused(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        bad = [a.name for a in node.names if a.name.split(".")[0] in REFUSED_MODULES]
        return f"imports {', '.join(bad)}" if bad else None
    if isinstance(node, ast.ImportFrom):
        root = (node.module or "").split(".")[0]
        return f"imports from {node.module or '.'}" if root in REFUSED_MODULES or node.level else None
    if isinstance(node, ast.Name) and node.id in REFUSED_CALLS | {"__builtins__"}:
        return f"uses {node.id}"
    if isinstance(node, ast.Attribute) and node.attr in REFUSED_ATTRIBUTES:
        return f"reaches for .{node.attr}"
    return None


class CallAudit:
    """Audits every call a fix's code makes while it runs. Use an instance as a FunctionPatch guard:
    `with audit():` around each run of fix code; the first refused call is recorded and aborts it."""

    def __init__(self, fix_files: Iterable[str], program_files: Iterable[str]):
        self.fix_files = {str(f) for f in fix_files}
        self.program_files = {str(Path(f).resolve()) for f in program_files} - self.fix_files
        self.violations: list[Violation] = []
        self._depth = 0  # fix frames on the stack: calls are audited while one is

    @contextmanager
    def __call__(self) -> Iterator[None]:
        previous = sys.getprofile()
        sys.setprofile(self._profile)
        try:
            yield
        finally:
            sys.setprofile(previous)
            self._depth = 0
        if self.violations:
            raise IntegrityError(f"the fix {self.violations[0].what}")

    def _profile(self, frame, event: str, arg) -> None:
        code = frame.f_code
        if event in ("call", "return") and code.co_filename in self.fix_files:
            self._depth += 1 if event == "call" else -1
            return
        if self._depth <= 0 or event not in ("call", "c_call"):
            return
        what = self._refused_call(code) if event == "call" else _refused_builtin(arg)
        if what is not None:
            caller = self._fix_frame(frame)
            self.violations.append(Violation("call", what, caller.f_code.co_filename, caller.f_lineno))
            sys.setprofile(None)
            raise IntegrityError(f"the fix {what}")

    def _fix_frame(self, frame):
        """The innermost frame of the fix's own code: where it made the refused call, however deep it landed."""
        while frame.f_code.co_filename not in self.fix_files and frame.f_back is not None:
            frame = frame.f_back
        return frame

    def _refused_call(self, code) -> str | None:
        file = code.co_filename
        where = f"{code.co_qualname} ({_short(file)})"
        if _in_engine(file):
            return f"calls the engine: {where}, where the reference pass lives"
        if file in self.program_files:
            return f"calls the program's own code: {where}, the implementation the reference runs"
        if any(part in file for part in _LOADER_FILES):
            return f"calls {where}, which loads saved data or reaches other frames"
        return None


def _refused_builtin(fn) -> str | None:
    name = _REFUSED_BUILTINS.get(id(fn))
    return f"calls {name}, which reaches objects, frames or files outside its inputs" if name else None


def _in_engine(file: str) -> bool:
    path = Path(file)
    return path.is_absolute() and path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in ENGINE_PACKAGES


def _short(file: str) -> str:
    """The file as the user knows it: within the project, else within the import folder it was found in
    (`torch/serialization.py`, wherever the environment lives)."""
    path = Path(file)
    if not path.is_absolute():
        return path.name
    bases = [ROOT, *sorted((Path(p) for p in sys.path if p and Path(p).is_absolute()), key=lambda b: -len(b.parts))]
    base = next((b for b in bases if path.is_relative_to(b)), None)
    return str(path.relative_to(base)) if base is not None else path.name
