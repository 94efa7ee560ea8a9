"""The program cache: a model file's Program saved the first time it is exported and loaded the next time instead of
exporting again (docs/cache.md).

What is cached is the export, nothing else: the user's file is still imported and its entry called every time, so
the weights, the inputs and whatever build() prints are the ones of this run, and a cached load gives the Program a
fresh export gives. An entry is keyed by everything its graph depends on: the model file and the user files it
imports (by content), the libraries it imports (by where they are installed and when), the entry, the driver,
torch, Python and this frontend, and what the entry built (the module tree and its settings, each tensor's name,
shape and dtype, the inputs' layout and their fixed values). Any of them changed is another key: a stale entry is
never used. An entry is saved without its weights (they come from the module built in this run); the constants a
forward makes itself are in it.

An entry holds the Program as trace files hold theirs (checkpoint/codec.py), not a torch.export archive: loading one
runs no torch.export.load, so nothing of torch._dynamo is imported on a cached launch. Entries are files, and files
are untrusted: the entry is decoded as a trace's Program is, every field checked and every op resolved only to an
operator registered with torch's dispatcher (nothing read is called, unpickled or evaluated), and every tensor it
names must fit the built module and the inputs given. An entry that does not is discarded with a note saying why,
and the program exported again.

Training steps (torch_train.py: make_fx over the export) are not cached.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import hmac
import importlib.util
import json
import logging
import os
import re
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import msgpack

import numpy as np
import torch
from torch.export.graph_signature import ConstantArgument, InputKind
from torch.utils import _pytree as pytree

from checkpoint.codec import decode_program, decode_tensor, encode_program, encode_tensor
from checkpoint.trace import unpacked
from hardware.errors import RewindError, echo
from hardware.frontends import torch_export, torch_train
from hardware.frontends.cache_folder import CacheFolder, cache_off, cap_bytes, model_id, sealing_key
from hardware.program import Program
from hardware.torch_tensors import dtype_name

log = logging.getLogger("rewind.cache")
FORMAT = 2  # of an entry: what it holds (1 was a torch.export archive)
_NOT_PROJECT = (Path(os.path.realpath(sysconfig.get_paths()["stdlib"])), Path(os.path.realpath(torch.__file__)).parent)
_INITIAL_KINDS = ("parameter", "buffer", "constant")  # values whose tensors come from the module (or the entry)


class Unusable(Exception):
    """Why an entry is not loaded, in the user's words."""


def load_program(path: str, entry: str = "build", steps: int = 1, driver: str = "auto",
                 note: Callable[[str], None] | None = None) -> Program:
    """torch_train.load_program, the export of an inference pass through the program cache of the model's folder
    (unless $REWIND_NO_CACHE is set). `note` hears why an entry was discarded, and which entry a file without
    build() runs."""
    if cache_off() or steps != 1:
        return torch_train.load_program(path, entry, steps, note)
    token = torch_export.LOAD_HOOKS.set(ProgramCache(Path(path), entry, driver, note))
    try:
        return torch_train.load_program(path, entry, steps, note)
    finally:
        torch_export.LOAD_HOOKS.reset(token)


class ProgramCache:
    """The cache as one load of one model file sees it (torch_export's LoadHooks for that load)."""

    def __init__(self, file: Path, entry: str, driver: str, note: Callable[[str], None] | None):
        self.file, self.entry, self.driver, self.note = file, entry, driver, note
        self.rank = _rank()
        self.model = model_id(file, entry, driver, self.rank)
        self.cap = cap_bytes()
        self.loaded = set(sys.modules)  # before the user's file: what it imports is what is new after
        self.dropped: set[str] = set()  # files of its modules from its folder and the folders it put on sys.path
        self.before = _sources(file)  # read before the file is imported: an edit meanwhile is seen

    def imported(self, files: list[str]) -> None:
        self.dropped.update(files)

    def program(self, model: torch.nn.Module, args: tuple, kwargs: dict, name: str) -> Program:
        """torch_export.fresh_program's result for these arguments: the cached Program, else exported (and saved)."""
        sources = self.sources()
        if sources is None:  # a file cannot be read, or the model file changed since it was imported
            return torch_export.fresh_program(model, args, kwargs, name)
        folder = CacheFolder.beside(self.file)
        key = self.key(model, args, kwargs, name, sources)
        target = folder.file_for(self.model, key)
        data = folder.read(target, self.cap)
        if data is not None:
            try:
                return _checked_load(data, key, model, args, kwargs)
            except Unusable as why:
                folder.remove(target)
                self._tell(f"the cached program of {self.file.name} ({self.entry}) was not used: {why}; it was "
                           "discarded and the program exported again")
        exported = torch_export.export(model, args, kwargs, name)
        program = torch_export.program_from_export(exported, torch_export.tensor_inputs(exported, args, kwargs), name,
                                                   model)
        if self.sources() == sources:  # the files exported are the files keyed
            entry = _entry(program, exported, model, args, kwargs, self._made_from(key))
            if entry is not None:
                folder.write(self.model, key, entry, self.cap)
        return program

    def sources(self) -> dict | None:
        """The files the program comes from as they are now (_sources), with those the load imported; None when
        one cannot be read or the model file is no longer the one imported."""
        if self.before is None or _sources(self.file) != self.before:
            return None
        new = (getattr(sys.modules.get(name), "__file__", None) for name in set(sys.modules) - self.loaded)
        return _sources(self.file, sorted(self.dropped | {f for f in new if isinstance(f, str) and _project_file(f)}))

    def key(self, model: torch.nn.Module, args: tuple, kwargs: dict, name: str, sources: dict) -> str:
        """What the entry of this export is named by: everything its graph depends on."""
        return _digest([FORMAT, _frontend(), torch.__version__, torch.__file__, sys.version,
                        str(torch.get_default_dtype()), self.entry, self.driver, self.rank, name, sources,
                        _built(model), _given(args, kwargs), self._globals(model)])

    def _globals(self, model: torch.nn.Module) -> list:
        """The plain module-level values of the user's files the program's code reads (a SCALE read from the
        environment at import, a table of settings): torch.export bakes them into the graph as constants, and they
        need not be in the files' text. The model file's module is found through its modules' classes (it is not in
        sys.modules); the user modules it imported, through sys.modules."""
        spaces = {id(g): g for m in model.modules()
                  if isinstance(g := getattr(getattr(type(m), "forward", None), "__globals__", None), dict)}
        spaces.update((id(vars(m)), vars(m)) for name in set(sys.modules) - self.loaded
                      if (m := sys.modules.get(name)) is not None)
        found = []
        for space in spaces.values():
            file = space.get("__file__")
            if isinstance(file, str) and _project_file(file):
                found.append([file, {k: v for k, v in space.items() if not k.startswith("__") and _plain(v)}])
        return sorted(found, key=lambda f: f[0])

    def _made_from(self, key: str) -> dict:
        return {"format": FORMAT, "key": key, "model": str(self.file.resolve()), "entry": self.entry,
                "driver": self.driver, "torch": torch.__version__}

    def _tell(self, text: str) -> None:
        log.warning(text)
        if self.note is not None:
            self.note(text)


# -- the key ---------------------------------------------------------------------------------------------------

def _digest(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:40]


@lru_cache(maxsize=1)
def _frontend() -> str:
    """This frontend's own code: a change to how programs are exported or stripped is another key."""
    return _digest([hashlib.sha256(Path(m.__file__).read_bytes()).hexdigest()
                    for m in (torch_export, sys.modules[__name__])])


def _sources(file: Path, imported: list[str] = ()) -> dict | None:
    """The files the program comes from: the model file, the user files it imports (read from its import statements,
    and `imported`, those the import loaded) by their contents, the libraries it imports by where they are
    installed and when. None when the model file cannot be read."""
    folder = file.resolve().parent
    users: dict[str, str] = {}
    libraries: dict[str, list] = {}
    todo = [file.resolve(), *(Path(f).resolve() for f in imported)]
    while todo:
        path = todo.pop()
        if str(path) in users:
            continue
        try:
            text = path.read_bytes()
        except (OSError, ValueError):
            if path == file.resolve():
                return None
            users[str(path)] = "unreadable"
            continue
        users[str(path)] = hashlib.sha256(text).hexdigest()
        for base, parts in _imports(text, path):
            found = _module_files(base or folder, parts)
            if not found and base is None:  # not in the model's folder: where the import finds it on sys.path
                elsewhere = _installed(parts[0], libraries)
                found = _module_files(elsewhere, parts) if elsewhere else []
            todo += found
    return {"user": users, "libraries": libraries}


def _project_file(file: str) -> bool:
    """A Python file of the user's, not of an installed library, the standard library or torch (keyed by their
    versions)."""
    path = Path(os.path.realpath(file))
    return path.suffix == ".py" and not ({"site-packages", "dist-packages"} & set(path.parts)) and not any(
        path.is_relative_to(root) for root in _NOT_PROJECT)


def _rank() -> str:
    """The rank of the torch.distributed process group this process is ('' outside one): ranks build their own."""
    dist = torch.distributed
    return f"{dist.get_rank()} of {dist.get_world_size()}" if dist.is_available() and dist.is_initialized() else ""


def _imports(source: bytes, path: Path) -> Iterator[tuple[Path | None, list[str]]]:
    """Each module a file imports, anywhere in it: (None, absolute name parts), or (the folder a relative import
    starts from, parts)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # its import fails, and says why, before anything is exported
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((None, alias.name.split(".")) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = path.parents[node.level - 1] if 0 < node.level <= len(path.parents) else None
            module = node.module.split(".") if node.module else []
            if module:
                yield base, module
            yield from ((base, module + [alias.name]) for alias in node.names if alias.name != "*")


def _module_files(folder: Path, parts: list[str]) -> list[Path]:
    """The source files of a module under `folder`: each package's __init__.py on the way, and its own file."""
    found = []
    for part in parts:
        if (folder / part / "__init__.py").is_file():
            found.append(folder / part / "__init__.py")
        elif (folder / f"{part}.py").is_file():
            found.append(folder / f"{part}.py")
            break
        elif not (folder / part).is_dir():  # a folder without __init__.py is a namespace package
            break
        folder = folder / part
    return [p.resolve() for p in found]


def _installed(top: str, libraries: dict[str, list]) -> Path | None:
    """Where a module the model's folder does not hold is found on sys.path: a library is noted in `libraries` by
    where it is installed and when (an upgrade rewrites it); user code elsewhere on the path (a project root) is
    scanned as the model's own, from the folder returned."""
    if top in sys.stdlib_module_names or top == "torch" or top in libraries:
        return None
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: found, not imported
        origin = Path(spec.origin).resolve() if spec is not None and isinstance(spec.origin, str) else None
        if origin is None or origin.suffix != ".py":
            return None
        if {"site-packages", "dist-packages"} & set(origin.parts):
            stat = origin.stat()
            libraries[top] = [str(origin), stat.st_size, stat.st_mtime_ns]
            return None
    except (ImportError, ValueError, OSError):  # not importable: its import fails, and says why
        return None
    return origin.parent.parent if origin.name == "__init__.py" else origin.parent


def _built(model: torch.nn.Module) -> list:
    """What the entry built, as far as its graph depends on it: each module's class and plain settings (and those of
    a settings object it holds, such as a Hugging Face config), each tensor's name, shape, dtype and device."""
    modules = [[name, f"{type(m).__module__}.{type(m).__qualname__}", _settings(m)]
               for name, m in model.named_modules(remove_duplicate=False)]
    tensors = [[name, list(t.shape), str(t.dtype), str(t.device)]
               for name, t in torch_export.model_tensors(model).items()]
    return [modules, tensors]


def _settings(obj: Any, depth: int = 0) -> dict:
    found = {}
    for k, v in vars(obj).items():
        if _plain(v):
            found[k] = v
        elif depth == 0 and hasattr(v, "__dict__") and not isinstance(v, (torch.nn.Module, torch.Tensor, type)):
            found[k] = _settings(v, 1)
    return found


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return len(value) <= 64 and all(_plain(v) for v in value)
    if isinstance(value, dict):
        return len(value) <= 64 and all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float, str, enum.Enum, torch.dtype, np.generic))


def _given(args: tuple, kwargs: dict) -> list:
    """The inputs' layout, each tensor's shape, dtype and device, and the values fixed at export."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return [str(spec), [[list(x.shape), str(x.dtype), str(x.device)] if isinstance(x, torch.Tensor) else
                        [type(x).__qualname__, repr(x) if _plain(x) else None] for x in leaves]]


# -- writing an entry ------------------------------------------------------------------------------------------

def _entry(program: Program, exported: Any, model: torch.nn.Module, args: tuple, kwargs: dict,
           made_from: dict) -> bytes | None:
    """The entry's bytes: what it was made from, then the Program without the module's tensors or the inputs (their
    names, shapes and dtypes only), with the constants forward made itself and the order export took keyword
    inputs in; None for a program this cache does not hold (one its own loading would refuse, or load as another
    Program than this one)."""
    own = torch_export.model_tensors(model)
    constants = {name: encode_tensor(program.initial[name]) for name, info in program.values.items()
                 if info.kind == "constant" and info.target not in own}
    in_spec = exported.call_spec.in_spec
    order = list(torch_export.reorder_kwargs(kwargs, in_spec)) if kwargs and in_spec is not None else []
    key = sealing_key()
    try:
        body = msgpack.packb({"program": encode_program(program), "constants": constants, "keywords": order},
                             use_bin_type=True)
        made = msgpack.packb(made_from, use_bin_type=True)
        data = made + msgpack.packb({"seal": _seal(key, made, body), "body": body}, use_bin_type=True)
        loaded = _checked_load(data, made_from["key"], model, args, kwargs)
    except Exception:  # noqa: BLE001 (any failure to write one means: not cached, the launch goes on)
        return None
    same = loaded.nodes == program.nodes and loaded.values == program.values and loaded.outputs == program.outputs \
        and loaded.buffer_mutations == program.buffer_mutations and loaded.initial.keys() == program.initial.keys()
    return data if same else None


# -- loading an entry ------------------------------------------------------------------------------------------

def _seal(key: bytes | None, made: bytes, body: bytes) -> str:
    if key is None:
        raise Unusable("there is nowhere to keep the key that seals entries")
    return hmac.new(key, made + body, hashlib.sha256).hexdigest()


def _checked_load(data: bytes, key: str, model: torch.nn.Module, args: tuple, kwargs: dict) -> Program:
    """The Program in an entry that passes every check; Unusable says which one it failed. Only an entry sealed with
    this user's key (cache_folder.sealing_key: one Rewind wrote here, whose Program it checked against the export
    then) is decoded at all."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data) + 1)
    unpacker.feed(data)
    try:
        made_from = next(unpacker)
        made = data[:unpacker.tell()]
        sealed = next(unpacker)
        if unpacker.tell() != len(data):
            raise Unusable("it has bytes after its end (the entry is damaged)")
    except (StopIteration, ValueError, TypeError, OverflowError, MemoryError, RecursionError, msgpack.UnpackException):
        raise Unusable("it is not a program entry (the entry is damaged)") from None
    if not isinstance(made_from, dict) or made_from.get("key") != key or made_from.get("format") != FORMAT:
        raise Unusable("it was made for another program")
    if not isinstance(sealed, dict) or not isinstance(sealed.get("seal"), str) or not isinstance(sealed.get("body"),
                                                                                                 bytes):
        raise Unusable("it is not a program entry (the entry is damaged)")
    if not hmac.compare_digest(_seal(sealing_key(), made, sealed["body"]), sealed["seal"]):
        raise Unusable("it is not sealed as the entries Rewind writes for you are (it was changed, or made elsewhere)")
    body, problem = unpacked(sealed["body"])
    if problem is not None or not isinstance(body, dict) or not {"program", "constants", "keywords"} <= body.keys():
        raise Unusable("it is not a program entry (the entry is damaged)")
    initial: dict[str, Any] = {}
    try:
        program = decode_program(body["program"], initial, run_on_meta=False)  # sealed: checked when written
    except RewindError as exc:  # its words name the node or value and what is wrong
        raise Unusable(f"its program is not one Rewind wrote ({exc})") from None
    initial.update(_initial(program, body, model, args, kwargs))
    program.source_files = torch_export.source_files(program.nodes)  # as they are now: the key holds their text
    return program


def _initial(program: Program, body: dict, model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The tensors the Program starts from: the built module's, the entry's own constants, the inputs given, each
    fitting the value it is (shape and dtype)."""
    own = torch_export.model_tensors(model)
    constants, order = body["constants"], body["keywords"]
    if not isinstance(constants, dict) or not isinstance(order, list) or (kwargs and sorted(order) != sorted(kwargs)):
        raise Unusable("it takes other inputs than the ones given")
    ordered = {k: kwargs[k] for k in order} if kwargs else {}
    given = iter(t for t in pytree.tree_leaves((args, ordered)) if isinstance(t, torch.Tensor))
    initial: dict[str, Any] = {}
    for name, info in program.values.items():
        if info.kind == "input":
            tensor = next(given, None)
        elif info.kind in _INITIAL_KINDS:
            if info.target in own:
                tensor = own[info.target]
            elif info.kind == "constant" and name in constants:
                try:
                    tensor = decode_tensor(constants[name])
                except RewindError:
                    raise Unusable(f"its constant '{echo(name)}' is damaged") from None
            else:
                tensor = None
        else:
            continue
        if not (isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" and tuple(tensor.shape) == info.shape
                and dtype_name(tensor.dtype) == info.dtype):
            raise Unusable(f"its value '{echo(name)}' does not fit the module built")
        initial[name] = tensor.detach()
    if next(given, None) is not None:
        raise Unusable("it takes other inputs than the ones given")
    return initial
