"""The two sides of a comparison, as the user names them, loaded into Programs.

A side is
- a model file, `model.py` or `model.py:entry` (its entry returns `(module, inputs)`, as `rewind forensics` takes);
- the same file at a git revision, `model.py@HEAD~1` (`model.py@v2:build`): read with `git show` into a file of
  the same name in a temporary folder (its folder's other files still import), named as the user wrote it;
- a function inside a file (`--function blocked_attention` on the candidate, `ref.py:sdpa_attention` on the
  reference): called with the same arguments on both sides (`--inputs file.py:fn`, else an `inputs()` of the
  candidate's file, else of the reference's);
- a driver, `torch:cpu:float64`: the candidate's own program on another driver (provenance/reference.py).

A function is exported as a Program like a model (hardware/frontends/torch_export.py), every function of its file
anchored so that its lines, not only a module's forward, are the nodes' source lines.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from hardware.errors import ProgramLoadError, RewindError, echo, program_stopped_itself, raised_in_user_code
from hardware.frontends.torch_export import (Inputs, checked_inputs, export_program, module_and_inputs,
                                             positional_names, user_file)
from hardware.program import Program

DRIVER_PREFIXES = ("torch:", "sim")
_REVISION = re.compile(r"^(?P<file>.+?\.py)(?:@(?P<rev>[^:]+))?(?::(?P<name>[A-Za-z_][A-Za-z0-9_]*))?$")


@dataclass(frozen=True)
class SideSpec:
    text: str  # as the user wrote it
    file: Path | None = None  # absolute; None for a driver
    revision: str | None = None
    name: str | None = None  # the entry (a model) or the function
    driver: str | None = None

    @property
    def label(self) -> str:
        if self.driver:
            return self.driver
        label = self.file.name + (f"@{self.revision}" if self.revision else "")
        return label + (f":{self.name}" if self.name else "")


def parse_side(text: str, what: str) -> SideSpec:
    """`what`: 'candidate' or 'reference', for the message when `text` names nothing usable."""
    if text.startswith(DRIVER_PREFIXES):
        return SideSpec(text, driver=text)
    found = _REVISION.match(text)
    if found is None:
        raise RewindError(f"the {what} {echo(repr(text), 200)} is not a Python file (model.py, model.py:entry, "
                          "model.py@HEAD~1) nor a driver such as torch:cpu:float64")
    file = Path(os.path.abspath(found["file"]))
    if found["rev"] is None and not file.is_file():
        raise RewindError(f"the {what} file {echo(found['file'], 200)} does not exist")
    return SideSpec(text, file, found["rev"], found["name"])


@contextmanager
def source_of(spec: SideSpec) -> Iterator[Path]:
    """The file to import for `spec`: the file itself, or its text at the revision in a temporary folder (removed
    afterwards) with the original folder importable after it."""
    if spec.revision is None:
        yield spec.file
        return
    text = _git_show(spec)
    folder = Path(tempfile.mkdtemp(prefix="rewind-compare-"))
    copy = folder / spec.file.name
    copy.write_text(text)
    sys.path.append(str(spec.file.parent))  # the file's neighbours, as they are now
    try:
        yield copy
    finally:
        sys.path.remove(str(spec.file.parent))
        shutil.rmtree(folder, ignore_errors=True)


def _git_show(spec: SideSpec) -> str:
    folder = spec.file.parent
    if not folder.is_dir():
        raise RewindError(f"{spec.label}: the folder {folder} does not exist")
    try:
        done = subprocess.run(["git", "show", f"{spec.revision}:./{spec.file.name}"], cwd=folder,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RewindError(f"{spec.label}: git could not be run to read the revision: {exc}") from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"git exited with status {done.returncode}"
        if "not a git repository" in said:
            raise RewindError(f"{spec.label}: {folder} is not inside a git repository, so it has no revision "
                              f"{spec.revision}")
        raise RewindError(f"{spec.label}: git has no {spec.file.name} at revision {echo(spec.revision)} ({echo(said)})")
    return done.stdout


@dataclass
class Loaded:
    """One side loaded: how to export its Program over a set of arguments, and its own example arguments."""

    spec: SideSpec
    export: Callable[[Inputs], Program]
    example: Inputs | None  # the side's own arguments: a model's entry's, a file's inputs(); None for a function
    function: Callable | None = None  # a function side's callable (the anti-cheat reads its source)
    source: Path | None = None  # the file imported (a revision's temporary copy)

    def display(self, path: str) -> str:
        """A source path as the user knows it: a revision's temporary copy named `file.py@REV`."""
        if self.source is not None and self.spec.revision and os.path.realpath(path) == os.path.realpath(self.source):
            return f"{self.spec.file.name}@{self.spec.revision}"
        return Path(path).name


@contextmanager
def loaded(spec: SideSpec, function: str | None) -> Iterator[Loaded]:
    """The side, loaded: `function` names a function of its file to compare (None: the file is a model)."""
    with source_of(spec) as file, _user_code(f"loading {spec.label}"):
        with user_file(file) as module:
            _anchor(module)
            if function is not None:
                fn = _function(module, function, spec)
                example = _own_inputs(module, spec)
                yield Loaded(spec, lambda args: _export_function(fn, args, function, spec, file), example, fn, file)
            else:
                model, inputs = _model(module, spec.name or "build", file)
                yield Loaded(spec, lambda args: _export_model(model, args, file.stem), inputs, None, file)


def _function(module: Any, name: str, spec: SideSpec) -> Callable:
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__
                         and not n.startswith("_"))
        raise RewindError(f"{spec.label} defines no function '{name}' (its functions: {', '.join(defined) or 'none'})")
    if not callable(fn) or isinstance(fn, type):
        raise RewindError(f"'{name}' in {spec.label} is not a function")
    return fn


def _own_inputs(module: Any, spec: SideSpec) -> Inputs | None:
    make = getattr(module, "inputs", None)
    if make is None or not callable(make):
        return None
    try:
        return checked_inputs(make(), f"inputs() in {spec.label} returned")
    except RewindError:
        raise
    except Exception as exc:
        said = raised_in_user_code(exc, str(spec.file))
        raise RewindError(f"calling inputs() in {spec.label} failed: {said}") from None


def inputs_from(text: str) -> Inputs:
    """`--inputs file.py:fn` (default fn: inputs): the arguments both sides are called with."""
    file, _, name = text.partition(":")
    spec = parse_side(file, "inputs")
    with user_file(spec.file) as module:
        fn = getattr(module, name or "inputs", None)
        if fn is None or not callable(fn):
            raise RewindError(f"{spec.file.name} defines no function '{name or 'inputs'}' returning the arguments")
        try:
            return checked_inputs(fn(), f"{name or 'inputs'}() in {spec.file.name} returned")
        except RewindError:
            raise
        except Exception as exc:
            raise RewindError(f"calling {name or 'inputs'}() in {spec.file.name} failed: "
                              f"{raised_in_user_code(exc, str(spec.file))}") from None


def _model(module: Any, entry: str, file: Path) -> tuple[torch.nn.Module, Inputs]:
    fn = getattr(module, entry, None)
    if fn is None or not callable(fn):
        raise RewindError(f"{file.name} defines no '{entry}' (the entry that returns (module, inputs)); name the "
                          "function to compare with --function")
    try:
        result = fn()
    except Exception as exc:
        raise RewindError(f"calling {entry}() in {file.name} failed: {raised_in_user_code(exc, file)}") from None
    return module_and_inputs(result, entry, file)


def check_signatures(candidate: Loaded, reference: Loaded, name: str, against: str) -> None:
    """Two functions called with the same arguments take as many positional arguments."""
    mine, theirs = positional_names(candidate.function), positional_names(reference.function)
    if len(mine) != len(theirs):
        raise RewindError(f"the signatures do not match: {name}({', '.join(mine)}) takes {len(mine)} argument(s) "
                          f"where {against}({', '.join(theirs)}) takes {len(theirs)}")


class Called(torch.nn.Module):
    """A function as a module, to export it: its forward calls the function with the arguments."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _export_function(fn: Callable, args: Inputs, name: str, spec: SideSpec, file: Path) -> Program:
    if isinstance(args, dict):
        raise RewindError("a function is called with positional arguments: its inputs() returns a tuple")
    try:
        with _user_code(f"calling {name}"):
            program = export_program(Called(fn), args, name)
    except ProgramLoadError as exc:
        cause = exc.__cause__
        said = raised_in_user_code(_innermost(cause), file) if cause is not None else str(exc)
        raise RewindError(f"calling {name}() of {spec.label.split(':')[0]} with the arguments "
                          f"{_typed(args)} failed: {said}") from None
    mine = os.path.realpath(__file__)
    nodes = [replace(n, frames=tuple(f for f in n.frames if os.path.realpath(f.loc.file) != mine))
             for n in program.nodes]
    return replace(program, nodes=nodes, source_files={p: t for p, t in program.source_files.items()
                                                        if os.path.realpath(p) != mine})


def _innermost(exc: BaseException) -> BaseException:
    """The exception the user's code raised, under what torch.export wrapped it in."""
    while exc.__cause__ is not None and exc.__cause__ is not exc:
        exc = exc.__cause__
    return exc


def _typed(args: tuple) -> str:
    return "(" + ", ".join(f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}" if isinstance(a, torch.Tensor)
                           else echo(repr(a), 40) for a in args) + ")"


def _export_model(model: torch.nn.Module, args: Inputs, name: str) -> Program:
    with _user_code(f"exporting {name}"):
        return export_program(model, args, name)


def _anchor(module: Any) -> None:
    """Every function and method of the user's files (the one imported and those beside it that it imports from)
    keeps its frame in a node's stack (torch.export keeps only `forward` frames otherwise), so a helper's line is
    the node's line."""
    register = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if register is None:
        return
    folder = os.path.dirname(os.path.realpath(module.__file__))
    for value in vars(module).values():
        members = vars(value).values() if inspect.isclass(value) else [value]
        for member in members:
            code = getattr(member, "__code__", None) if inspect.isfunction(member) else None
            if code is not None and os.path.dirname(os.path.realpath(code.co_filename)) == folder:
                register(member)


@contextmanager
def _user_code(doing: str) -> Iterator[None]:
    try:
        yield
    except SystemExit as exc:
        raise RewindError(program_stopped_itself(exc, doing)) from None
    except ProgramLoadError:
        raise
