"""An export that fails for a known cause says what to change, in the user's terms, once: a key/value cache among
the outputs, data-dependent control flow, an input of a type torch.export cannot take. The same words at the Session,
through the wire (the launch's error) and from `rewind forensics` (exit status 2)."""

from __future__ import annotations

import re

import pytest
import torch

from dap_server.client import DapError
from hardware.errors import ProgramLoadError
from hardware.session import LaunchOptions, Session
from provenance import forensics_cli
from tests.conftest import MODELS, line_of
from tests.dap.wire import Debugger, SchemaCheck

HINTS = MODELS / "hf_hints.py"
GATE_LINE = line_of(HINTS, "if y.sum() > 0:")

# entry -> what the message must say (regular expressions), in order
CASES = {
    "cache_in_outputs": [r"the model returns a DynamicCache", r"set use_cache=False in its config",
                         r"model\.config\.use_cache = False", r"LlamaConfig\(\.\.\., use_cache=False\)",
                         r"pass use_cache=False among the inputs"],
    "data_dependent": [rf"hf_hints\.py:{GATE_LINE} `if y\.sum\(\) > 0:`", r"data-dependent control flow",
                       r"torch\.where", r"torch\.cond", r"static shape"],
    "numpy_input": [r"input 'scale' \(the second positional input\) is a numpy\.ndarray",
                    r"torch\.from_numpy", r"an input is a tensor, or a tuple, list or dict of tensors",
                    r"numbers, booleans, strings and None"],
    "object_in_keyword_input": [r"input 'scale' at \['factor'\]\[1\] is a builtins\.object",
                                r"an input is a tensor, or a tuple, list or dict of tensors"],
}
PYTHON_WORDS = re.compile(r"\b\w*(Error|Exception|Warning)\b|Traceback|<class ")


def says(message: str, entry: str) -> None:
    position = 0
    for pattern in CASES[entry]:
        found = re.compile(pattern).search(message, position)
        assert found, f"{pattern!r} not in (or out of order in) {message!r}"
        position = found.end()
    assert not PYTHON_WORDS.search(message), message
    assert "def forward" not in message  # no dump of torch's partial graph


@pytest.mark.parametrize("entry", list(CASES))
def test_the_session_refuses_the_model_with_the_fix(entry):
    session = Session()
    with pytest.raises(ProgramLoadError) as refused:
        session.launch(LaunchOptions(str(HINTS), entry=entry, driver="torch:cpu"))
    says(str(refused.value), entry)
    assert session.program is None


@pytest.fixture(scope="module")
def server():
    schema = SchemaCheck()
    debugger = Debugger.spawn(schema)
    debugger.initialize()
    yield debugger
    debugger.close()
    assert schema.failures == []


@pytest.mark.parametrize("entry", list(CASES))
def test_the_launch_is_refused_through_the_wire_with_the_fix(server, entry):
    with pytest.raises(DapError) as refused:
        server.request("launch", {"program": str(HINTS), "entry": entry, "driver": "torch:cpu"}, timeout=120)
    says(refused.value.message, entry)


@pytest.mark.parametrize("entry", list(CASES))
def test_rewind_forensics_prints_the_fix_once_and_exits_two(capsys, entry):
    status = forensics_cli.main([str(HINTS), "--entry", entry, "--driver", "torch:cpu", "--budget-mb", "64"])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    (line,) = [ln for ln in err.splitlines() if ln.strip()]  # one message, on one line: nothing of torch's own
    assert line.startswith("rewind forensics: ")
    says(line, entry)


# -- the advice works ----------------------------------------------------------------------------------------------

def test_following_the_cache_hint_the_model_loads_and_runs():
    session = Session()
    session.launch(LaunchOptions(str(HINTS), entry="cache_turned_off_by_keyword", driver="torch:cpu"))
    program = session.program
    assert [n for n, v in program.values.items() if v.kind == "input"] == ["input_ids"]  # use_cache: fixed
    assert program.outputs == ["logits"]
    assert session.start().reason == "end"
    number = Session()
    number.launch(LaunchOptions(str(HINTS), entry="number_among_inputs", driver="torch:cpu"))
    assert [n for n, v in number.program.values.items() if v.kind == "input"] == ["x"]
    assert number.start().reason == "end"
    x = number.program.initial["x"]
    assert torch.equal(number.tensor(number.program.outputs[0]), x * 2)


def test_wire_following_the_cache_hint_the_model_loads_and_runs(server):
    """Last in this file: the module's server keeps the program it loads."""
    mark = server.client.mark()
    server.request("launch", {"program": str(HINTS), "entry": "cache_turned_off_by_keyword", "driver": "torch:cpu",
                              "stopOnEntry": True}, timeout=120)
    server.client.wait_for("initialized", after=mark)
    assert server.motion("configurationDone", {})["reason"] == "entry"
    assert server.motion("continue")["reason"] == "end"
    assert "float32[1, 8, 64]" in server.evaluate("logits")["result"]
