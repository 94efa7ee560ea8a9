"""The program cache: a model file's exported program saved with torch.export.save and loaded the next time instead
of exporting again (docs/cache.md).

What is cached is the export, nothing else: the user's file is still imported and its entry called every time, so
the weights, the inputs and whatever build() prints are the ones of this run, and a cached load gives the Program a
fresh export gives. An entry is keyed by everything its graph depends on: the model file and the user files it
imports (by content), the libraries it imports (by where they are installed and when), the entry, the driver,
torch, Python and this frontend, and what the entry built (the module tree and its settings, each tensor's name,
shape and dtype, the inputs' layout and their fixed values). Any of them changed is another key: a stale entry is
never used. An entry is saved without its weights (they come from the module built in this run).

Entries are files, and files are untrusted: before torch.export.load (which would unpickle, evaluate symbolic
expressions and load compiled code if an archive held them) an entry must be what this module writes and nothing
else — no pickled data, no compiled code, no symbolic expressions, every operator a `torch.ops` name — and after
it every node must call a registered operator overload and every tensor fit the built module. An entry that is
not is discarded with a note saying why, and the program exported again.

Training steps (torch_train.py: make_fx over the export, which torch.export.save cannot write) are not cached.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import importlib.util
import io
import json
import logging
import operator
import os
import re
import sys
import sysconfig
import zipfile
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ConstantArgument, InputKind
from torch.utils import _pytree as pytree

from hardware.errors import echo
from hardware.frontends import torch_export, torch_train
from hardware.frontends.cache_folder import METADATA, CacheFolder, cache_off, cap_bytes, model_id
from hardware.program import Program

log = logging.getLogger("rewind.cache")
FORMAT = 1  # of an entry: what is stripped, what rewind.json holds
# The parts of an archive torch.export.save writes for a program without weights, example inputs or objects.
_PART = re.compile(r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
                   r"|models/model\.json|data/sample_inputs/model\.pt|data/(weights|constants)/model_\1_config\.json"
                   r"|data/weights/weight_\d+|data/constants/tensor_\d+|extra/" + re.escape(METADATA))
_NEEDED = ("models/model.json", "data/weights/model_weights_config.json",
           "data/constants/model_constants_config.json", "extra/" + METADATA)
# torch.ops.<namespace>.<op>.<overload>; an op may be a dunder (aten.__and__.Tensor), a namespace or overload not.
_OPERATOR = re.compile(r"torch\.ops\.(?!__)[A-Za-z_]\w*\.[A-Za-z_]\w*\.(?!__)[A-Za-z_]\w*")
# Argument forms that never occur in a program Rewind caches: a symbolic expression (torch parses it with
# sympy, which evaluates it), a subgraph, an object.
_REFUSED_FORMS = ("as_expr", "as_graph", "as_custom_obj", "as_opaque_obj")
_NOT_PROJECT = (Path(os.path.realpath(sysconfig.get_paths()["stdlib"])), Path(os.path.realpath(torch.__file__)).parent)
_TORCH_LOGGERS = ("torch.export", "torch.export.pt2_archive._package", "torch._export.serde.serialize")


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

    def export(self, model: torch.nn.Module, args: tuple, kwargs: dict, name: str) -> ExportedProgram:
        """torch_export.export's result for these arguments: the cached one, else exported (and saved)."""
        sources = self.sources()
        if sources is None:  # a file cannot be read, or the model file changed since it was imported
            return torch_export.export(model, args, kwargs, name)
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
        if self.sources() == sources:  # the files exported are the files keyed
            archive = _archive(exported, model, self._made_from(key))
            if archive is not None:
                folder.write(self.model, key, archive, self.cap)
        return exported

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

def _archive(exported: ExportedProgram, model: torch.nn.Module, made_from: dict) -> bytes | None:
    """The entry's bytes: the program with its weights left out (shapes and dtypes only), no example inputs; None
    for a program this cache does not hold (one its own loading would refuse)."""
    own = torch_export.model_tensors(model)
    meta = {k: _placeholder(v) if k in own else v for k, v in exported.constants.items()}
    try:
        stripped = ExportedProgram(
            root=exported.graph_module, graph=exported.graph, graph_signature=exported.graph_signature,
            state_dict={k: _placeholder(v) for k, v in exported.state_dict.items()},
            range_constraints=exported.range_constraints, module_call_graph=exported.module_call_graph,
            example_inputs=None, constants=meta, verifiers=exported.verifiers)
        buffer = io.BytesIO()
        with _torch_quiet():
            torch.export.save(stripped, buffer, extra_files={METADATA: json.dumps(made_from)})
        data = buffer.getvalue()
        _check_parts(data)
    except Exception:  # noqa: BLE001 (any failure to write one means: not cached, the launch goes on)
        return None
    return data


def _placeholder(tensor: Any) -> Any:
    if not isinstance(tensor, torch.Tensor):
        return tensor
    empty = torch.empty_like(tensor, device="meta")
    return torch.nn.Parameter(empty, tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) else empty


# -- loading an entry ------------------------------------------------------------------------------------------

def _checked_load(data: bytes, key: str, model: torch.nn.Module, args: tuple, kwargs: dict) -> ExportedProgram:
    """The ExportedProgram in an entry that passes every check; Unusable says which one it failed."""
    made_from = _check_parts(data)
    if made_from.get("key") != key or made_from.get("format") != FORMAT:
        raise Unusable("it was made for another program")
    try:
        with _torch_quiet():
            exported = torch.export.load(io.BytesIO(data))
    except Exception:  # noqa: BLE001 (what torch raises on a damaged archive varies; the note says it in words)
        raise Unusable("torch could not read it (the entry is damaged)") from None
    _check_graph(exported)
    _check_fit(exported, model, args, kwargs)
    return exported


def _check_parts(data: bytes) -> dict:
    """Refuse an archive holding anything but what _archive writes; its rewind.json."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
        roots = {i.filename.split("/", 1)[0] for i in infos}
        parts = {i.filename.split("/", 1)[-1]: i for i in infos}
        if len(roots) != 1 or len(parts) != len(infos):
            raise Unusable("it is not laid out as a program archive")
        odd = sorted(p for p in parts if not _PART.fullmatch(p))
        if odd:
            raise Unusable(f"it holds a part a cached program never has ({echo(odd[0])}): compiled code, pickled "
                           "objects or example inputs are never loaded")
        if any(i.compress_type != zipfile.ZIP_STORED for i in infos) or any(n not in parts for n in _NEEDED):
            raise Unusable("it is not laid out as a program archive")

        def read(part: str) -> Any:
            return json.loads(archive.read(parts[part]))

        _check_payloads(read("data/weights/model_weights_config.json"), weights=True)
        _check_payloads(read("data/constants/model_constants_config.json"), weights=False)
        if any(i.file_size for p, i in parts.items() if p.startswith(("data/weights/weight_", "data/sample_"))):
            raise Unusable("it holds weights or example inputs, which a cached program leaves out")
        _check_program(read("models/model.json"))
        made_from = read("extra/" + METADATA)
    except Unusable:
        raise
    except (zipfile.BadZipFile, ValueError, KeyError, TypeError, AttributeError, EOFError, RecursionError):
        raise Unusable("it is not a program archive (the entry is damaged)") from None
    if not isinstance(made_from, dict):
        raise Unusable("it does not say what it was made from")
    return made_from


def _check_payloads(config: dict, weights: bool) -> None:
    """Weights are placeholders (no data); constants are plain tensors; nothing is pickled."""
    for payload in config["config"].values():
        device = payload["tensor_meta"]["device"]["type"]
        if payload["use_pickle"] is not False or (weights and device != "meta") or not (
                weights or payload["path_name"].startswith("tensor_")):
            raise Unusable("it holds pickled data or weights, which a cached program never has")


def _check_program(program: dict) -> None:
    """The serialized graph names no symbolic expression, subgraph or object, and only torch.ops operators."""
    if program["range_constraints"] or program.get("guards_code"):
        raise Unusable("it holds symbolic shapes, which a cached program never has")
    stack = [program]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if any(form in item for form in _REFUSED_FORMS):
                raise Unusable("it holds symbolic expressions or objects, which a cached program never has")
            stack += item.values()
        elif isinstance(item, list):
            stack += item
    for node in program["graph_module"]["graph"]["nodes"]:
        target = node["target"]
        if not (target == "_operator.getitem" or (isinstance(target, str) and _OPERATOR.fullmatch(target))):
            raise Unusable(f"a node calls {echo(repr(target))}, which is not a torch operator")


def _check_graph(exported: ExportedProgram) -> None:
    """Every node calls a registered operator overload (or takes an item of a result)."""
    for node in exported.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function" or not (node.target is operator.getitem or isinstance(
                node.target, torch._ops.OpOverload)):
            raise Unusable(f"its node '{echo(node.name)}' calls something that is not a registered torch operator")


def _check_fit(exported: ExportedProgram, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Each tensor the program reads is one of the built module's (or a constant it holds itself), and each input
    the one given, with the same shape and dtype."""
    own = torch_export.model_tensors(model)
    placeholders = {n.name: n.meta.get("val") for n in exported.graph.nodes if n.op == "placeholder"}
    try:
        given = iter(torch_export.tensor_inputs(exported, args, kwargs))
    except Exception:  # noqa: BLE001 (inputs laid out otherwise: pytree says so in its own words)
        raise Unusable("it takes other inputs than the ones given") from None
    for spec in exported.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument):
            continue
        if spec.kind == InputKind.USER_INPUT:
            tensor = next(given, None)
        else:
            tensor = own.get(spec.target, exported.constants.get(spec.target))
        expected = placeholders.get(spec.arg.name)
        if not (isinstance(tensor, torch.Tensor) and isinstance(expected, torch.Tensor) and tensor.device.type !=
                "meta" and tensor.shape == expected.shape and tensor.dtype == expected.dtype):
            raise Unusable(f"its value '{echo(spec.arg.name)}' does not fit the module built")


@contextmanager
def _torch_quiet() -> Iterator[None]:
    """torch logs its own account of a damaged archive (with a traceback); the note says it once, in words."""
    loggers = [logging.getLogger(name) for name in _TORCH_LOGGERS]
    for logger in loggers:
        logger.addFilter(_drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(_drop)


def _drop(record: logging.LogRecord) -> bool:
    return False
