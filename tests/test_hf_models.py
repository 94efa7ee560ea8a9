"""Models as users have them: a Hugging Face model returned by `build()` as it is (no wrapper module), its inputs as
keyword arguments, its outputs a `ModelOutput`, debugged inside the library's own source; and libraries' frames are
the user's code, whatever their folder is called or wherever they are installed.

GPT-2, LLaMA, BERT and T5 are built from tiny configs with random weights (tests/models/hf_models.py; nothing is
downloaded). Each behaviour is checked at the Session and through the wire (one DAP server for the module, each model
loaded into it in turn with a relaunch), and `rewind forensics` passes the correct models."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from dap_server.console import Console
from hardware.frontends.torch_export import load_module
from hardware.session import Direction, FunctionSpec, LineSpec, LaunchOptions, Session
from provenance import forensics_cli
from tests.conftest import MODELS, ROOT, line_of, open_session, program
from tests.dap.wire import Debugger, SchemaCheck

MODEL = MODELS / "hf_models.py"
LIBRARY = Path(transformers.__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    entry: str  # the entry of tests/models/hf_models.py
    source: str  # the library's source file the model runs, under transformers/
    line_text: str  # a line of it where a breakpoint goes (found by its text, never by number), one whose
    # first node is its own (not a call into another module written in Python, whose frame would be on top)
    cls: str  # a module class to break on: every instance
    spellings: tuple[str, ...]  # one module, as a user writes it from their own variable `model`
    path: str  # ... and as the Program names it
    inputs: tuple[str, ...]  # the keywords build() gave
    outputs: tuple[str, ...]  # the ModelOutput's fields

    @property
    def file(self) -> str:
        return str(LIBRARY / self.source)

    @property
    def line(self) -> int:
        return line_of(Path(self.file), self.line_text)


CASES = [
    Case("gpt2", "models/gpt2/modeling_gpt2.py", "hidden_states = attn_output + residual", "GPT2MLP",
         ("model.transformer.h.1.mlp", "model.transformer.h[1].mlp", "h.1.mlp"), "transformer.h.1.mlp",
         ("input_ids", "attention_mask"), ("logits",)),
    Case("llama", "models/llama/modeling_llama.py",
         "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))", "LlamaRMSNorm",
         ("model.model.layers.1.mlp", "model.layers.1.mlp", "layers.1.mlp"), "model.layers.1.mlp",
         ("input_ids",), ("logits",)),
    Case("bert", "models/bert/modeling_bert.py", "hidden_states = self.LayerNorm(hidden_states + input_tensor)",
         "BertSelfAttention", ("model.bert.encoder.layer.1.intermediate", "encoder.layer[1].intermediate"),
         "bert.encoder.layer.1.intermediate", ("input_ids", "attention_mask"), ("logits",)),
    Case("t5", "models/t5/modeling_t5.py", "hidden_states = self.wi(hidden_states)", "T5LayerNorm",
         ("model.decoder.block.1.layer.2", "model.decoder.block[1].layer[2]"), "decoder.block.1.layer.2",
         ("input_ids", "decoder_input_ids"), ("logits", "encoder_last_hidden_state")),
]


@pytest.fixture(scope="module", params=CASES, ids=[c.entry for c in CASES])
def case(request) -> Case:
    return request.param


def eager(case: Case) -> tuple[torch.nn.Module, dict, object]:
    """The model, its inputs and its output, run as its user runs it (the same weights: build() seeds)."""
    model, inputs = load_module(MODEL, case.entry)
    with torch.no_grad():
        return model, inputs, model(**inputs)


def instances(case: Case) -> list[str]:
    """The Program's paths of every module of the case's class (the model's own list of them)."""
    model, _ = load_module(MODEL, case.entry)
    return [name for name, m in model.named_modules() if type(m).__name__ == case.cls]


def session(case: Case) -> Session:
    return open_session(MODEL, entry=case.entry)


def instance_at(node, cls: str) -> str:
    return next(path for path, c in node.module_stack if c.rsplit(".", 1)[-1] == cls)


def bits(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().cpu().numpy().tobytes()


# -- the Session ----------------------------------------------------------------------------------------------------

def test_build_returns_the_model_as_it_is_inputs_by_keyword_outputs_by_field(case):
    prog = program(str(MODEL), case.entry)
    model, inputs, out = eager(case)
    assert [n for n, v in prog.values.items() if v.kind == "input"] == list(case.inputs)
    assert all(torch.equal(prog.initial[name], inputs[name]) for name in case.inputs)
    assert prog.outputs == list(case.outputs)
    s = session(case)
    assert s.start().reason == "end"
    for name in case.outputs:  # the pass, node by node, is the model's own forward bit for bit
        assert bits(s.tensor(name)) == bits(getattr(out, name))
        assert s.evaluate(f"{name}.shape") == getattr(out, name).shape


def test_line_breakpoint_in_the_library_source_verifies_and_stops_there(case):
    s = session(case)
    (bp,) = s.set_line_breakpoints(case.file, [LineSpec(case.line)])
    assert bp.verified and bp.line == case.line, bp.message
    stop = s.start()
    assert stop.reason == "breakpoint"
    top = s.frames()[0]
    assert (top.file, top.line) == (case.file, case.line)


def test_function_breakpoint_on_a_class_stops_on_entering_each_instance(case):
    s = session(case)
    (bp,) = s.set_function_breakpoints([FunctionSpec(case.cls)])
    assert bp.verified, bp.message
    entered = []
    stop = s.start()
    while stop.reason == "function breakpoint":
        node = s.current_node()
        entered.append(instance_at(node, case.cls))
        before = s.tl.node_at(stop.tick - 1)
        assert before is None or entered[-1] not in [p for p, _ in before.module_stack]
        stop = s.run()
    assert stop.reason == "end"
    assert sorted(entered) == sorted(instances(case)) and len(entered) == len(set(entered))


def test_function_breakpoint_on_a_module_path_as_the_user_writes_it(case):
    for spelling in case.spellings:
        s = session(case)
        (bp,) = s.set_function_breakpoints([FunctionSpec(spelling)])
        assert bp.verified, (spelling, bp.message)
        stop = s.start()
        assert stop.reason == "function breakpoint"
        assert s.current_node().module_path.startswith(case.path)
        assert not s.tl.node_at(stop.tick - 1).module_path.startswith(case.path)
        assert s.run().reason == "end"


def test_a_module_path_that_is_not_there_is_refused_with_the_names_that_are(case):
    s = session(case)
    (bp,) = s.set_function_breakpoints([FunctionSpec(case.path.replace(".1.", ".7."))])
    assert not bp.verified
    assert "no node, op or module path" in bp.message and "nor a module class" in bp.message
    assert case.path in bp.message  # did you mean ...


def test_a_module_path_that_names_several_modules_asks_for_the_whole_path():
    s = session(CASES[3])  # T5: an encoder and a decoder, each with its block.0
    (bp,) = s.set_function_breakpoints([FunctionSpec("block.0")])
    assert not bp.verified
    assert bp.message == "'block.0' names 2 modules (encoder.block.0, decoder.block.0): give the whole path"


def test_stepping_back_restores_every_value_bit_for_bit(case):
    s = session(case)
    s.set_function_breakpoints([FunctionSpec(case.spellings[0])])
    there = s.start().tick
    before = {name: bits(s.tensor(name)) for name in s.live_values()}
    assert s.run().reason == "end"
    _, _, out = eager(case)
    assert all(bits(s.tensor(n)) == bits(getattr(out, n)) for n in case.outputs)
    assert s.run(Direction.REVERSE).tick == there
    assert {name: bits(s.tensor(name)) for name in s.live_values()} == before
    s.goto(there + 1)
    assert s.step(Direction.REVERSE, "instruction").tick == there  # one node back
    assert {name: bits(s.tensor(name)) for name in s.live_values()} == before


# -- through the wire -----------------------------------------------------------------------------------------------

class Server:
    """One DAP server for the module; each test loads its program into it (a relaunch when another is loaded)."""

    def __init__(self) -> None:
        self.schema = SchemaCheck()
        self.debugger = Debugger.spawn(self.schema)
        self.debugger.initialize()
        self.loaded: tuple[str, str] | None = None

    def load(self, path: Path, entry: str = "build") -> Debugger:
        """`path`'s entry loaded, no breakpoints, stopped on entry at tick 0."""
        d = self.debugger
        arguments = {"program": str(path), "entry": entry, "driver": "torch:cpu", "stopOnEntry": True}
        if self.loaded is None:
            mark = d.client.mark()
            d.request("launch", arguments, timeout=180)
            d.client.wait_for("initialized", after=mark)
            assert d.motion("configurationDone", {})["reason"] == "entry"
        elif self.loaded != (str(path), entry):
            assert d.motion("restart", {"arguments": arguments})["reason"] == "entry"
        else:
            d.request("setFunctionBreakpoints", {"breakpoints": []})
            assert d.motion("restart", {})["reason"] == "entry"
        self.loaded = (str(path), entry)
        return d


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.debugger.close()
    assert s.schema.failures == [], "messages that break the DAP schema"


@pytest.fixture
def wire(server, case) -> Debugger:
    d = server.load(MODEL, case.entry)
    yield d
    d.set_breakpoints(Path(case.file), [])
    d.request("setFunctionBreakpoints", {"breakpoints": []})


def run_to_end(d: Debugger) -> list[dict]:
    stops = []
    while (stop := d.motion("continue"))["reason"] != "end":
        stops.append(stop)
    return stops


def test_wire_outputs_are_named_by_field_and_inputs_by_keyword(wire, case):
    assert wire.top()["name"]  # stopped on entry
    values = {v["name"] for v in wire.scope("Live values")}
    assert set(case.inputs) <= values
    assert run_to_end(wire) == []
    _, _, out = eager(case)
    for name in case.outputs:
        assert f"float32{list(getattr(out, name).shape)}" in wire.evaluate(name)["result"]


def test_wire_line_breakpoint_in_the_library_source(wire, case):
    (bp,) = wire.set_breakpoints(Path(case.file), [{"line": case.line}])
    assert bp["verified"] and bp["line"] == case.line, bp
    stop = wire.motion("continue")
    assert stop["reason"] == "breakpoint"
    top = wire.top()
    assert (top["source"]["path"], top["line"]) == (case.file, case.line)


def test_wire_function_breakpoints_by_class_and_by_dotted_path(wire, case):
    missing = case.path.replace(".1.", ".7.")
    bp, absent = wire.request("setFunctionBreakpoints", {"breakpoints": [{"name": case.cls}, {"name": missing}]}
                              )["breakpoints"]
    assert bp["verified"] and not absent["verified"], (bp, absent)
    assert f"no node, op or module path '{missing}'" in absent["message"] and case.path in absent["message"]
    stops = run_to_end(wire)
    assert {s["reason"] for s in stops} == {"function breakpoint"} and len(stops) == len(instances(case))
    for spelling in case.spellings:
        wire.motion("restart", {})
        (bp,) = wire.request("setFunctionBreakpoints", {"breakpoints": [{"name": spelling}]})["breakpoints"]
        assert bp["verified"], (spelling, bp)
        assert wire.motion("continue")["reason"] == "function breakpoint"
        assert f"[{case.path}" in wire.top()["name"]
        assert wire.motion("continue")["reason"] == "end"


def test_console_break_on_a_class_and_on_a_dotted_path(wire, case):
    """`break` in `rewind debug`'s console (its --json records), over this module's server."""
    for spec in (case.cls, case.spellings[0]):
        wire.motion("restart", {})
        out = io.StringIO()
        console = Console(wire.client, out, json_mode=True)
        assert console.execute(f"break {spec}") and console.execute("continue")
        set_, stopped = [json.loads(line) for line in out.getvalue().splitlines()]
        assert set_["ok"] and set_["result"]["verified"], set_
        assert stopped["ok"] and stopped["result"]["reason"] == "function breakpoint", stopped
        assert stopped["result"]["breakpoints"] == [set_["result"]["number"]]


def node_input_bytes(d: Debugger) -> dict[str, bytes]:
    """Every byte of each input of the node about to run, read through readMemory."""
    scope = next(s for s in d.request("scopes", {"frameId": 1})["scopes"] if s["name"].startswith("Node "))
    out = {}
    for v in d.variables(scope["variablesReference"]):
        if "memoryReference" not in v or not v.get("type", "").startswith("input"):
            continue
        nbytes = d.request("locate", {"name": v["evaluateName"]})["shards"][0]["nbytes"]
        memory = d.request("readMemory", {"memoryReference": v["memoryReference"], "offset": 0, "count": nbytes})
        assert memory.get("unreadableBytes", 0) == 0
        out[v["name"]] = base64.b64decode(memory["data"])
    return out


def test_wire_step_back_restores_values_bit_for_bit(wire, case):
    wire.request("setFunctionBreakpoints", {"breakpoints": [{"name": case.spellings[0]}]})
    assert wire.motion("continue")["reason"] == "function breakpoint"
    there, before = wire.position(), node_input_bytes(wire)
    assert before
    assert wire.motion("continue")["reason"] == "end"
    assert wire.motion("reverseContinue")["reason"] == "function breakpoint"
    assert wire.position() == there and node_input_bytes(wire) == before
    wire.request("setFunctionBreakpoints", {"breakpoints": []})
    wire.motion("next")
    assert wire.position() > there
    wire.motion("stepBack")
    assert wire.position() <= there
    wire.motion("goto", {"threadId": 1, "targetId": there + 1})  # goto's target ids are tick + 1
    assert wire.position() == there and node_input_bytes(wire) == before


# -- rewind forensics -------------------------------------------------------------------------------------------------

def test_rewind_forensics_passes_bert_in_a_fresh_process():
    command = [sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())", "forensics",
               str(MODEL), "--entry", "bert", "--driver", "torch:cpu", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert not report["problem"] and [o["value"] for o in report["outputs"]] == ["logits"]


@pytest.mark.parametrize("entry", ["gpt2", "llama"])
def test_rewind_forensics_passes_gpt2_and_llama(capsys, entry):
    status = forensics_cli.main([str(MODEL), "--entry", entry, "--driver", "torch:cpu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and not report["problem"]
    assert [o["value"] for o in report["outputs"]] == ["logits"] and all(o["within"] for o in report["outputs"])


def test_rewind_forensics_passes_t5_whose_log_of_zero_is_absorbed_on_purpose(capsys):
    """T5's relative-position buckets take log(0) = -inf, discard it (a cast to a bucket index, then torch.where)
    before any output, and the float64 reference does the same: absorbed, not a problem."""
    status = forensics_cli.main([str(MODEL), "--entry", "t5", "--driver", "torch:cpu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and not report["problem"] and report["nonfinite"] is None, report["headline"]
    assert report["absorbed"] and report["headline"].startswith("clean")
    for born in report["absorbed"]:
        assert (born["op"], born["kind"], born["reachesOutput"]) == ("aten.log.default", "inf", False)
        assert born["source"].rsplit(":", 1)[0].endswith("modeling_t5.py") and born["absorbedAt"]


# -- libraries are the user's code (defect 2) --------------------------------------------------------------------------

LIBRARY_SOURCE = '''\
import torch
from torch import nn


class FakeBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        return torch.relu(h) * 2  # the library's line
'''

MODEL_SOURCE = '''\
import sys

import torch
from torch import nn

sys.path.insert(0, {folder!r})  # where the library is installed
from {package}.layers import FakeBlock


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = FakeBlock()

    def forward(self, x):
        return self.block(x) + 1


def build():
    torch.manual_seed(0)
    return Model(), (torch.randn(2, 4),)
'''
LIBRARY_LINE = LIBRARY_SOURCE.splitlines().index("        return torch.relu(h) * 2  # the library's line") + 1


@dataclass(frozen=True)
class FakeLibrary:
    model: Path  # the user's model file, which puts the library's folder on sys.path
    layers: Path  # the library's source file


def fake_library(folder: Path, package: str, models: Path) -> FakeLibrary:
    (folder / package).mkdir(parents=True)
    (folder / package / "__init__.py").write_text("")
    (folder / package / "layers.py").write_text(LIBRARY_SOURCE)
    model = models / f"uses_{package}.py"
    model.write_text(MODEL_SOURCE.format(folder=str(folder), package=package))
    return FakeLibrary(model, (folder / package / "layers.py").resolve())


@pytest.fixture(scope="module")
def torch_named_library(tmp_path_factory):
    """A library whose folder's name starts with torch's, installed beside torch's own package as torchvision,
    torchaudio or torch_geometric are: `<site-packages>/torchfake_<id>/`, a temporary folder the model file puts
    on sys.path (torch's own package folder is a prefix of its path, which must not make it torch's)."""
    folder = Path(torch.__file__).resolve().parent.parent / f"torchfake_{uuid.uuid4().hex[:12]}"
    try:
        yield fake_library(folder, "fakelib", tmp_path_factory.mktemp("torchfake"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_library_named_like_torch_shows_its_frames(torch_named_library):
    lib = torch_named_library
    s = Session()
    s.launch(LaunchOptions(str(lib.model), driver="torch:cpu"))
    assert str(lib.layers) in s.program.files()
    (bp,) = s.set_line_breakpoints(str(lib.layers), [LineSpec(LIBRARY_LINE)])
    assert bp.verified, bp.message
    assert s.start().reason == "breakpoint"
    top = s.frames()[0]
    assert (top.file, top.line, top.module_path) == (str(lib.layers), LIBRARY_LINE, "block")
    assert s.current_node().frames[-1].module_class == "FakeBlock"


def test_wire_a_library_named_like_torch_shows_its_frames(server, torch_named_library):
    lib = torch_named_library
    d = server.load(lib.model)
    try:
        (bp,) = d.set_breakpoints(lib.layers, [{"line": LIBRARY_LINE}])
        assert bp["verified"], bp
        assert d.motion("continue")["reason"] == "breakpoint"
        top = d.top()
        assert (top["source"]["path"], top["line"]) == (str(lib.layers), LIBRARY_LINE)
        assert top["name"].endswith("[block]")
    finally:
        d.set_breakpoints(lib.layers, [])


@pytest.fixture(scope="module")
def interpreter_lib(tmp_path_factory):
    """An interpreter laid out as one installed outside a virtual environment: its standard library folder holds
    site-packages, and a library installed there. The real interpreter runs with PYTHONHOME at a copy of the
    standard library's folder (its entries linked) that has a site-packages of its own; this project's virtual
    environment still provides torch. Returns the library and the environment to run with."""
    home = tmp_path_factory.mktemp("home")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lib = home / sys.platlibdir / stdlib.name
    lib.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name not in ("site-packages", "dist-packages"):
            (lib / entry.name).symlink_to(entry)
    library = fake_library(lib / "site-packages", "stdfake", tmp_path_factory.mktemp("stdfake"))
    env = {**os.environ, "PYTHONHOME": str(home), "PYTHONPATH": str(ROOT)}
    return library, env


SESSION_IN_THAT_INTERPRETER = '''
import json, os, sys, sysconfig
from hardware.session import LaunchOptions, LineSpec, Session
model, layers, line = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = Session()
s.launch(LaunchOptions(model, driver="torch:cpu"))
(bp,) = s.set_line_breakpoints(layers, [LineSpec(line)])
stop = s.start()
top = s.frames()[0]
print(json.dumps({"stdlib": os.path.realpath(sysconfig.get_paths()["stdlib"]), "verified": bp.verified,
                  "message": bp.message, "reason": stop.reason, "top": [top.file, top.line, top.module_path]}))
'''


def test_a_library_installed_inside_the_interpreters_lib_folder_shows_its_frames(interpreter_lib):
    """At the Session, in that interpreter (the frames a DAP server shows come from the same Program: the wire is
    checked with the library named like torch, above)."""
    lib, env = interpreter_lib
    done = subprocess.run([sys.executable, "-c", SESSION_IN_THAT_INTERPRETER, str(lib.model), str(lib.layers),
                           str(LIBRARY_LINE)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert str(lib.layers).startswith(seen["stdlib"] + os.sep)  # the layout this is about
    assert seen["verified"], seen["message"]
    assert seen["reason"] == "breakpoint" and seen["top"] == [str(lib.layers), LIBRARY_LINE, "block"]


def test_shape_input_sets_of_a_model_given_keyword_inputs_export_it_with_keywords():
    """The repair loop's shape sets export the model again: keyword inputs stay keywords (by position, a Hugging
    Face model would take the token ids for something else and the set would be skipped)."""
    from provenance.inputs import InputPlan, input_sets

    path = str(MODELS / "hf_models.py")
    llama = program(path, "llama")
    sets, skipped = input_sets(llama, InputPlan(seeds=0, scales=(), shapes=1), path, "llama")
    shapes = [s for s in sets if s.kind == "shape"]
    assert len(shapes) == 1, skipped
    grown = shapes[0].program.values["input_ids"].shape
    inputs = lambda p: [n for n, v in p.values.items() if v.kind == "input"]  # noqa: E731
    assert grown != llama.values["input_ids"].shape and inputs(shapes[0].program) == inputs(llama) == ["input_ids"]
