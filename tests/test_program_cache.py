"""The program cache (hardware/session/program_cache.py, docs/cache.md): a model's second load is its cached
program, equal to a fresh export; any keyed input changed is another entry, never the stale one; a damaged or
crafted entry is discarded with a note and the program exported again, and nothing in it runs; `rewind cache`
lists and clears; the folder keeps to its cap. Each test has its own copy of a small project (a model file, a
helper it imports, a package the helper imports, a module found through a folder the model file puts on
sys.path), so edits and entries stay its own."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import torch

from checkpoint import codec

from dap_server import cli
from hardware.errors import RewindError
from hardware.events import Output
from hardware.frontends import torch_export
from hardware.session import program_cache
from hardware.frontends.cache_folder import CACHE_DIR_ENV, CAP_ENV, NO_CACHE_ENV, CacheFolder, sealing_key
from hardware.session import LaunchOptions, Session
from tests.conftest import EXAMPLES, MODELS

PROJECT = {
    "model.py": '''
import sys
from pathlib import Path

import torch
from torch import nn

from layers import Block

sys.path.insert(0, str(Path(__file__).parent / "vendor"))
from scaling import scaled  # found in the folder the file put on sys.path


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block(4)
        self.head = nn.Linear(4, 4, bias=False)
        self.head.weight = self.block.lin.weight  # tied
        self.register_buffer("steps", torch.zeros(1))
        self.register_buffer("mask", torch.ones(4), persistent=False)
        self.offset = torch.arange(4.0)  # a plain tensor attribute: export lifts it as a constant

    def forward(self, x, scale: bool = True):
        self.steps.add_(1)
        y = self.block(x) * self.mask * ((x > -9) & (x < 9)) + self.offset + torch.tensor([0.5])  # aten.__and__
        return scaled(self.head(y)) if scale else y


def build():
    torch.manual_seed(0)
    return Model(), {"x": torch.randn(2, 4), "scale": True}


def build_block():
    torch.manual_seed(0)
    return Block(4), (torch.randn(2, 4),)
''',
    "layers.py": '''
import torch
from torch import nn

from parts.act import activation


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("gain", torch.full((width,), 2.0))

    def forward(self, x):
        return activation(self.lin(x)) * self.gain
''',
    "vendor/scaling.py": '''
def scaled(x):
    return x * 2
''',
    "parts/__init__.py": "",
    "parts/act.py": '''
import torch


def activation(x):
    return torch.relu(x)
''',
}
TRAINING = MODELS / "training" / "mlp_sgd.py"


def write_project(folder: Path) -> Path:
    for name, text in PROJECT.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(text.lstrip())
    return folder / "model.py"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A fresh copy of the project, with its cache beside it (as a user's is: no $REWIND_CACHE_DIR)."""
    monkeypatch.delenv(CACHE_DIR_ENV)
    return write_project(tmp_path)


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """One copy of the project for the tests that only damage its entry: the model, its program, and the good
    entry's bytes (each such test leaves a good entry again)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(CACHE_DIR_ENV)
        model = write_project(tmp_path_factory.mktemp("cached"))
        program = program_cache.load_program(str(model))
        [entry] = entries(model)
    return model, program, entry.path.read_bytes()


def entries(model: Path) -> list:
    return CacheFolder.beside(model).entries()


def ops(program) -> set[str]:
    return {n.op for n in program.nodes}


def assert_same_program(cached, fresh) -> None:
    """Everything a Program carries: nodes (names, ops, arguments, source lines and frames, module paths), values,
    outputs, buffer writes, sources, and the initial tensors."""
    assert cached.name == fresh.name and cached.nodes == fresh.nodes
    assert [n.loc for n in cached.nodes] == [n.loc for n in fresh.nodes] and any(n.module_stack for n in fresh.nodes)
    assert cached.values == fresh.values and cached.outputs == fresh.outputs
    assert cached.buffer_mutations == fresh.buffer_mutations and cached.source_files == fresh.source_files
    assert cached.initial.keys() == fresh.initial.keys()
    assert all(torch.equal(cached.initial[k], fresh.initial[k]) for k in fresh.initial)


def test_a_second_load_is_the_cached_program_and_equals_a_fresh_export(project, monkeypatch):
    fresh = torch_export.load_program(project)
    exports = []
    real = torch_export.export
    monkeypatch.setattr(torch_export, "export", lambda *a: exports.append(a) or real(*a))
    first = program_cache.load_program(str(project))
    second = program_cache.load_program(str(project))
    assert len(exports) == 1, "the second load exported again"
    assert_same_program(first, fresh)
    assert_same_program(second, fresh)
    assert {"b_steps", "b_mask", "c_offset", "c_lifted_tensor_0"} <= set(second.initial)
    assert "aten.__and__.Tensor" in ops(second)  # an operator named as a dunder is an operator too
    assert second.initial["p_block_lin_weight"].data_ptr() == second.initial["p_head_weight"].data_ptr()  # tied
    [entry] = entries(project)
    assert entry.path.parent == project.parent / ".rewind" / "programs" and entry.size < 64 * 1024  # no weights
    assert (project.parent / ".rewind" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_a_cached_gpt_has_the_fresh_exports_source_lines_module_paths_and_names():
    fresh = torch_export.load_program(EXAMPLES / "gpt.py")
    program_cache.load_program(str(EXAMPLES / "gpt.py"))
    assert_same_program(program_cache.load_program(str(EXAMPLES / "gpt.py")), fresh)
    assert any(n.module_stack[-1][0] == "blocks.1.attn" for n in fresh.nodes if n.module_stack)


@pytest.mark.parametrize("file, old, new, op", [
    ("model.py", "scaled(self.head(y))", "torch.tanh(scaled(self.head(y)))", "aten.tanh.default"),
    ("layers.py", "* self.gain", "- self.gain", "aten.sub.Tensor"),
    ("parts/act.py", "torch.relu", "torch.sigmoid", "aten.sigmoid.default"),
    ("vendor/scaling.py", "x * 2", "x.exp()", "aten.exp.default"),
])
def test_an_edit_of_the_model_or_a_file_it_imports_is_never_answered_from_the_cache(project, file, old, new, op):
    before = program_cache.load_program(str(project))
    path = project.parent / file
    path.write_text(path.read_text().replace(old, new))
    after = program_cache.load_program(str(project))
    assert op in ops(after) - ops(before)
    assert len(entries(project)) == 1  # the edited model's entry replaced the stale one


def test_another_entry_is_its_own_program(project):
    program_cache.load_program(str(project))
    block = program_cache.load_program(str(project), "build_block")
    assert_same_program(block, torch_export.load_program(project, "build_block"))
    assert len(entries(project)) == 2


def test_the_key_holds_the_driver_torchs_version_and_what_the_entry_built(project, monkeypatch):
    model, inputs = torch_export.load_module(project)
    args, kwargs = torch_export.split_inputs(inputs)

    def key(driver="auto"):
        cache = program_cache.ProgramCache(project, "build", driver, None)
        return cache.key(model, args, kwargs, "model", cache.sources())

    plain = key()
    assert plain == key()
    assert key("torch:cpu") != plain
    with monkeypatch.context() as patched:
        patched.setattr(torch, "__version__", "9.9.9")
        assert key() != plain
    model.block.lin.weight = torch.nn.Parameter(torch.zeros(4, 5))  # a weight of another shape
    assert key() != plain
    model.block.lin.weight = torch.nn.Parameter(torch.zeros(4, 4))  # same shape, other values: same graph
    assert key() == plain
    kwargs["scale"] = False  # a value fixed at export
    assert key() != plain


def test_a_library_the_model_imports_is_keyed_by_where_and_when_it_was_installed(tmp_path, monkeypatch):
    library = tmp_path / "site-packages" / "somelib"
    library.mkdir(parents=True)
    (library / "__init__.py").write_text("X = 1\n")
    (tmp_path / "model.py").write_text("import somelib\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    before = program_cache._sources(tmp_path / "model.py")
    assert set(before["libraries"]) == {"somelib"} and len(before["user"]) == 1
    os.utime(library / "__init__.py", ns=(1, 1))  # reinstalled
    assert program_cache._sources(tmp_path / "model.py") != before


# -- damaged and crafted entries -------------------------------------------------------------------------------

def parts(data: bytes) -> tuple[dict, dict]:
    """An entry's two objects: what it was made from, and the sealed body (its seal, its bytes)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    return next(unpacker), next(unpacker)


def sealed(made_from: dict, body: dict, key: bytes | None = None) -> bytes:
    """An entry as Rewind writes one, sealed with `key` (default: this user's)."""
    made, inner = msgpack.packb(made_from), msgpack.packb(body, use_bin_type=True)
    seal = hmac.new(key or sealing_key(), made + inner, hashlib.sha256).hexdigest()
    return made + msgpack.packb({"seal": seal, "body": inner}, use_bin_type=True)


def body_of(data: bytes) -> dict:
    return msgpack.unpackb(parts(data)[1]["body"], raw=False)


def with_node_op(op: str, reseal: bool):
    """The entry with its relu node calling `op`: resealed (as if Rewind had written it) or not (edited by hand)."""
    def craft(data: bytes) -> bytes:
        made_from, outer = parts(data)
        body = body_of(data)
        next(n for n in body["program"]["nodes"] if "relu" in n["op"])["op"] = op
        if reseal:
            return sealed(made_from, body)
        return msgpack.packb(made_from) + msgpack.packb({**outer, "body": msgpack.packb(body, use_bin_type=True)},
                                                        use_bin_type=True)
    return craft


def made_elsewhere(data: bytes) -> bytes:
    made_from, _ = parts(data)
    return sealed(made_from, body_of(data), key=b"0" * 64)  # anyone else's key: a project that came with its cache


def with_constant_of_another_shape(data: bytes) -> bytes:
    made_from, _ = parts(data)
    body = body_of(data)
    name = next(iter(body["constants"]))
    body["constants"][name] = codec.encode_tensor(torch.zeros(7))
    return sealed(made_from, body)


def with_an_extension_object(data: bytes) -> bytes:
    made_from, _ = parts(data)
    body = body_of(data)
    body["keywords"] = [msgpack.ExtType(7, b"payload")]  # msgpack's own escape hatch: decoded as data, never run
    return sealed(made_from, body)


CRAFTED = {
    "an op edited by hand": (with_node_op("builtins.exec", reseal=False), "it is not sealed"),
    "an entry made elsewhere": (made_elsewhere, "it is not sealed"),
    "a sealed entry calling a function": (with_node_op("builtins.exec", reseal=True), "not one Rewind wrote"),
    "a sealed entry calling a torch.ops method": (with_node_op("torch.ops.load_library.x.y", reseal=True),
                                                   "not one Rewind wrote"),
    "a constant of another shape": (with_constant_of_another_shape, "does not fit the module built"),
    "an extension object": (with_an_extension_object, "takes other inputs"),
    "bytes after its end": (lambda data: data + b"\x00", "bytes after its end"),
}


@pytest.mark.parametrize("craft", CRAFTED)
def test_a_crafted_entry_is_discarded_with_a_note_and_nothing_in_it_runs(cached, craft, monkeypatch):
    model, fresh, good = cached
    monkeypatch.delenv(CACHE_DIR_ENV)
    make, reason = CRAFTED[craft]
    [entry] = entries(model)
    entry.path.write_bytes(make(good))
    notes = []
    loaded = program_cache.load_program(str(model), note=notes.append)
    [note] = notes
    assert reason in note and "model.py" in note and "exported again" in note
    assert not any(word in note for word in ("Error", "Exception", "Traceback", "msgpack"))
    assert_same_program(loaded, fresh)
    [again] = entries(model)
    assert again.path == entry.path and again.size == len(good)  # a good entry again


def test_a_cached_launch_imports_nothing_of_torch_dynamo(cached):
    """What a cached load saves: an entry is decoded, not torch.export.load-ed (which imports torch._dynamo)."""
    model, _, _ = cached
    probe = ("import sys, torch\nfrom hardware.session import program_cache\n"
             f"program_cache.load_program({str(model)!r})\n"
             "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n")
    env = {k: v for k, v in os.environ.items() if k != CACHE_DIR_ENV}
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=240,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_a_pipe_named_as_the_entry_is_passed_over_not_waited_on(cached, monkeypatch):
    model, fresh, good = cached
    monkeypatch.delenv(CACHE_DIR_ENV)
    [entry] = entries(model)
    entry.path.unlink()
    os.mkfifo(entry.path)  # opened for reading, a pipe would wait for a writer that never comes
    assert_same_program(program_cache.load_program(str(model)), fresh)
    assert entry.path.is_file() and entry.path.stat().st_size == len(good)


def test_a_damaged_entry_is_discarded_with_a_note_in_the_session_and_rebuilt(project):
    program_cache.load_program(str(project), driver="torch:cpu")
    [entry] = entries(project)
    entry.path.write_bytes(entry.path.read_bytes()[: entry.size // 2])
    events = []
    session = Session(events.append)
    try:
        session.launch(LaunchOptions(str(project), driver="torch:cpu", budget_mb=16))
        assert session.program is not None and len(session.program.nodes) > 3
    finally:
        session.close()
    [note] = [e.text for e in events if isinstance(e, Output) and "cached program" in e.text]
    assert "damaged" in note and "exported again" in note
    assert not any(word in note for word in ("Error", "Exception", "Traceback", "msgpack"))
    [rebuilt_entry] = entries(project)
    assert rebuilt_entry.size > entry.size // 2


# -- the folder: off, cap, list, clear ----------------------------------------------------------------------------

def test_the_cache_can_be_turned_off(project, monkeypatch, capsys):
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    program_cache.load_program(str(project))
    monkeypatch.setenv(NO_CACHE_ENV, "0")  # on again, until --no-cache
    status = cli.main(["forensics", str(project), "--driver", "torch:cpu", "--budget-mb", "16", "--no-cache"])
    assert status in (0, 1) and os.environ[NO_CACHE_ENV] == "1"
    assert entries(project) == [] and not (project.parent / ".rewind").exists()


def test_past_its_cap_the_folder_drops_the_least_recently_used_entry(project, monkeypatch):
    program_cache.load_program(str(project))
    [first] = entries(project)
    monkeypatch.setenv(CAP_ENV, str(first.size * 1.2 / 2**20))
    program_cache.load_program(str(project), "build_block")
    [kept] = entries(project)
    assert kept.made_from["entry"] == "build_block" and not first.path.exists()


@pytest.mark.parametrize("cap", ["lots", "-1", "nan"])
def test_a_cap_that_is_no_size_is_refused_in_words(project, monkeypatch, cap):
    monkeypatch.setenv(CAP_ENV, cap)
    with pytest.raises(RewindError, match=f"{CAP_ENV} is the program cache's size in MiB, a number"):
        program_cache.load_program(str(project))


def test_rewind_cache_lists_and_clears_a_models_entries(project, capsys):
    program_cache.load_program(str(project))
    program_cache.load_program(str(project), "build_block")
    other = project.parent / "elsewhere.py"
    shutil.copy(project, other)
    assert cli.main(["cache", "list", str(project.parent)]) == 0
    listing = capsys.readouterr().out
    assert listing.count(str(project)) == 2 and "build_block" in listing and "2 cached programs" in listing
    assert cli.main(["cache", "list", str(project), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["entries"]) == 2
    assert cli.main(["cache", "clear", str(other)]) == 0 and "removed 0 cached programs" in capsys.readouterr().out
    assert cli.main(["cache", "clear", str(project.parent)]) == 0
    assert "removed 2 cached programs" in capsys.readouterr().out and entries(project) == []


@pytest.mark.parametrize("args, words", [
    (["cache", "list", "no/such/place"], "there is no model file or folder 'no/such/place'"),
    (["cache", "clear", "x" * 5000], "cannot be read: the name is too long"),
])
def test_rewind_cache_refuses_a_place_that_is_not_there_in_words(args, words, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert words in err and "Error" not in err


def test_rewind_cache_refuses_an_unknown_action(capsys):
    with pytest.raises(SystemExit):
        cli.main(["cache", "purge"])
    assert "invalid choice: 'purge'" in capsys.readouterr().err


def test_a_training_step_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    program = program_cache.load_program(str(TRAINING), "train_step")
    assert program.step_starts and CacheFolder.beside(TRAINING).entries() == []


def test_a_module_level_value_read_from_the_environment_is_part_of_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_DIR_ENV)
    model = tmp_path / "model.py"
    model.write_text("import os\nimport torch\nfrom torch import nn\nSCALE = float(os.environ.get('SCALE', '1'))\n\n\n"
                     "class Scale(nn.Module):\n    def forward(self, x):\n        return x * SCALE\n\n\n"
                     "def build():\n    return Scale(), (torch.ones(2),)\n")
    exports, scales = [], []
    real = torch_export.export
    monkeypatch.setattr(torch_export, "export", lambda *a: exports.append(a) or real(*a))
    for scale in ("1", "3", "3"):
        monkeypatch.setenv("SCALE", scale)
        [node] = program_cache.load_program(str(model)).nodes
        scales.append(node.args[1])
    assert scales == [1.0, 3.0, 3.0] and len(exports) == 2  # the third load is the second's entry


def test_the_cache_never_writes_through_a_link_left_in_its_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_DIR_ENV)
    (tmp_path / "project").mkdir()
    model = write_project(tmp_path / "project")
    (model.parent / ".rewind").mkdir()
    target = tmp_path / "elsewhere.txt"
    (model.parent / ".rewind" / ".gitignore").symlink_to(target)  # dangling: a write through it would create it
    program_cache.load_program(str(model))
    assert not target.exists() and len(entries(model)) == 1
