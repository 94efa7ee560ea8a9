"""Hostile arguments for every request the server registers, through a real server, in four states:
before launch, stopped on entry, at the end of the program, and on the many-core sim chip.

Each request's arguments are drawn (seeded: the run is the same every time) from its own pydantic
model: valid-typed values with extreme integers and huge, empty, unicode and NUL strings, wrong
types, missing and extra fields. Whatever is sent, the request is answered, no message the client
sees names a Python exception class, says "internal error" or "a bug in Rewind" or carries a
traceback, none quotes more than ECHO characters of one string the client sent, and the server
still answers `threads` afterwards. Paths the server might write go into a temporary folder only.
"""

from __future__ import annotations

import base64
import builtins
import json
import math
import os
import re
import shutil
import tempfile
import time
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import dap_server.dispatch  # noqa: F401  -- importing the dispatcher registers every request
from dap_server.client import DapClient, DapError
from dap_server.requests import REQUESTS
from tests.dap.wire import ROOT, Debugger, SchemaCheck, _observer

MODEL = ROOT / "examples" / "mlp.py"
ANSWER_S = 30.0  # every request is answered within this
ECHO = 250  # characters of one string the client sent that a message may quote back
# disconnect is not drawn: the front ends the connection after answering it, even when it refuses the arguments
COMMANDS = sorted(c for c in REQUESTS if c != "disconnect")
MOTIONS = {"continue", "reverseContinue", "next", "stepIn", "stepOut", "stepBack", "goto", "restart",
           "configurationDone", "restoreCheckpoint"}
VALUE_NAMES = ["x", "linear", "relu", "tanh", "linear_2", "p_fc1_weight", "h"]
BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
OTHER_EXCEPTIONS = {"LZ4BlockError", "JSONDecodeError", "ValidationError", "PicklingError", "UnpicklingError",
                    "ExtraData", "UnpackValueError", "BadZipFile", "CancelledError", "InvalidStateError",
                    "ArgumentError", "ParserError"}
LEAK = re.compile(r"\b(?:%s)\b|\bstruct\.error\b|internal error|a bug in Rewind|Traceback \(most recent call"
                  % "|".join(sorted(BUILTIN_EXCEPTIONS | OTHER_EXCEPTIONS, key=len, reverse=True)))
SANDBOX = Path(tempfile.mkdtemp(prefix="rewind-hostile-requests-"))
(SANDBOX / "a-file.txt").write_text("not a model, not a trace\n")
(SANDBOX / "a-folder").mkdir(exist_ok=True)

# -- values -----------------------------------------------------------------------------------------------
# Integers stay within what the adapter's pipe to its engine carries (msgpack: -2**63 .. 2**64 - 1).
INTS = [0, -1, 1, 2, 3, 5, 2**31 - 1, 2**31, -2**31, 10**6, 10**12, 2**63 - 1, 2**63, -2**63, 2**64 - 1,
        0x800007c0, 0x10000100004]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e308, -1e308, 5e-324, 1e-300, math.nan, math.inf, -math.inf]
STRINGS = ["", " ", "x", "\x00", "a\x00b", "é🙂\u202e\ufeff", "a" * 200_000, "0x0", "0x" + "f" * 30, "0x-1", "-1",
           "1e999", "rewind-value:", "rewind-value:linear", "rewind-value:" + "z" * 300, *VALUE_NAMES, "9**9**9",
           "'a' * 64 * 10**6", "(" * 150 + ")" * 150, "-(" * 200 + "1" + ")" * 200, "[c for c in ()]",
           "x.tolist()", "round(x)", "1/0", "{x}", "{9**9**9}", "nan", "experiment", "original", "float64",
           "torch:cpu", "sim", "line", "instruction", "race", "hang", "divergence", "==3", "%0", "linear:1",
           "0x10000100004", "0x10000100000", "0x80000000", "0x800007c0", "0xffffffffffffffff"]  # sim chip addresses
PATHS = [str(SANDBOX / "out.rwd"), str(SANDBOX / "a-file.txt"), str(SANDBOX / "a-folder"),
         str(SANDBOX / "missing" / "deeper" / "x.rwd"), str(SANDBOX / "a-file.txt" / "under-a-file"),
         str(SANDBOX / ("n" * 300)), str(SANDBOX / "nul\x00.rwd"), "", "relative.rwd", str(SANDBOX / "nope.py")]
PATH_FIELDS = {"path", "record", "trace", "spillDir", "knowledge", "program", "reference"}
# Python the client gives to run (a fix file, a replacement op): the user's own code, as build() is; drawn from
# code that ends (code that never ends is a hung program: the front's watchdog, not a request's answer).
CODE = ["", "PATCHES = []", "PATCHES = 5", "x = (", "def f(x):\n    return x * 2\n", "\x00", "é🙂",
        "def softmax(x, dim=-1):\n    return x\n", "raise ValueError('from the fix')"]
CODE_FIELDS = {"text", "function"}
WRONG = st.sampled_from([None, True, "text", 1.5, [], {}, [1, "a"], {"a": 1}, 2**63, -1, ""])
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.sampled_from(INTS), st.sampled_from(FLOATS[:6]),
                              st.sampled_from(STRINGS[:8])),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "x", ""]),
                                                                                inner, max_size=2), max_leaves=6)
_MISSING = object()


def integers() -> st.SearchStrategy:
    return st.sampled_from(INTS) | st.integers(-3, 40)


def strings(name: str = "") -> st.SearchStrategy:
    if name in PATH_FIELDS:
        return st.sampled_from(PATHS)
    if name in CODE_FIELDS:
        return st.sampled_from(CODE)
    return st.sampled_from(STRINGS) | st.text(max_size=12)


def of_type(annotation: Any, name: str = "", depth: int = 0) -> st.SearchStrategy:
    """Values of a field's declared type, leaning on the extremes."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any or annotation is typing.Any:
        return JSON
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        return st.one_of([of_type(a, name, depth) for a in args])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (list, typing.List):
        item = of_type(args[0], name, depth + 1) if args else JSON
        return st.lists(item, max_size=3 if depth < 2 else 1)
    if origin in (dict, typing.Dict) or annotation is dict:
        return st.dictionaries(st.sampled_from(["a", "eps", "", "x" * 70]), JSON, max_size=2)
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return integers()
    if annotation is float:
        return st.sampled_from(FLOATS) | st.sampled_from(INTS)
    if annotation is str:
        return strings(name)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return arguments_of(annotation, depth + 1)
    return JSON


def arguments_of(model: type[BaseModel], depth: int = 0) -> st.SearchStrategy:
    """A dict for `model`: every field of its declared type (extreme values), optional ones present or not."""
    required, optional = {}, {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        (required if info.is_required() else optional)[key] = of_type(info.annotation, key, depth)
    return st.fixed_dictionaries(required, optional=optional)


def misshapen(model: type[BaseModel]) -> st.SearchStrategy:
    """A dict for `model` with fields wrongly typed or missing, and sometimes a field it does not have."""
    fields = {}
    for name, info in model.model_fields.items():
        valid = of_type(info.annotation, info.alias or name)
        fields[info.alias or name] = st.one_of(valid, WRONG, st.just(_MISSING))
    extra = st.dictionaries(st.sampled_from(["extra", "tik", "__class__", "x" * 100]), JSON, max_size=1)
    return st.tuples(st.fixed_dictionaries(fields), extra).map(
        lambda pair: {k: v for k, v in {**pair[0], **pair[1]}.items() if v is not _MISSING})


def hostile(command: str) -> st.SearchStrategy:
    model = REQUESTS[command].arguments
    drawn = st.one_of(*[arguments_of(model)] * 8, *[misshapen(model)] * 3,
                      st.sampled_from([None, [], "arguments", 7, [{"a": 1}]]))
    return drawn


# -- checking what the server says ------------------------------------------------------------------------
def leaks(messages: list[dict]) -> list[str]:
    found = []
    for message in messages:
        text = json.dumps(message, ensure_ascii=False)
        if message.get("type") == "response" and message.get("success"):
            # a successful answer may show what it was asked about; what it says of its own is checked below
            text = json.dumps({k: v for k, v in message.items() if k != "body"}, ensure_ascii=False)
        match = LEAK.search(text)
        if match:
            at = max(0, match.start() - 150)
            found.append(f"{message.get('command') or message.get('event')}: …{text[at:match.end() + 150]}…")
    return found


def echoes(arguments: Any, messages: list[dict]) -> list[str]:
    """Messages that quote more than ECHO characters of one string the client sent."""
    long = [text[:ECHO] for text in _strings(arguments) if len(text) > ECHO]
    found = []
    for message in messages:
        if _refused_arguments(message):
            continue  # the argument check (dap_server/requests.py) quotes what it refused: reported, not ours
        text = json.dumps(message, ensure_ascii=False)
        found += [f"{message.get('command') or message.get('event')}: {text[:300]}…" for part in long if part in text]
    return found


def _refused_arguments(message: dict) -> bool:
    text = message.get("message") or ""
    return (message.get("type") == "response" and not message.get("success")
            and text.startswith(f"{message.get('command')}: field '"))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):  # a path names its file in full where it is refused (saveTrace, launch): not checked
        return [s for k, v in value.items() if k not in PATH_FIELDS for s in _strings(k) + _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


class Prober:
    """One server in one state: sends hostile requests and checks what comes back."""

    def __init__(self, debugger: Debugger):
        self.debugger = debugger
        self.seen = 0
        self.stuck = ""  # the request the server did not answer: later tests on it fail at once

    def new_messages(self) -> list[dict]:
        messages = self.debugger.messages[self.seen:]
        self.seen += len(messages)
        return messages

    def send(self, command: str, arguments: Any) -> None:
        assert not self.stuck, f"the server stopped answering at {self.stuck}"
        client = self.debugger.client
        mark = client.mark()
        self.new_messages()
        try:
            response = client.send(command, arguments).wait(ANSWER_S)
        except Exception as exc:  # noqa: BLE001 -- no answer at all: say what the server said last
            self.stuck = f"{command} {_shown(arguments)[:300]}"
            pytest.fail(f"no answer to {command} {_shown(arguments)} within {ANSWER_S:.0f} s ({exc}); "
                        f"server log: {list(client.stderr_tail)[-20:]}")
        if response.success and command in MOTIONS:
            client.wait_for("stopped", after=mark, timeout=ANSWER_S)
        try:
            client.request("threads", timeout=10)
        except Exception as exc:  # noqa: BLE001
            self.stuck = f"{command} {_shown(arguments)[:300]}"
            pytest.fail(f"after {command} {_shown(arguments)} the server no longer answers threads: {exc}; "
                        f"server log: {list(client.stderr_tail)[-20:]}")
        messages = self.new_messages()
        found = leaks(messages)
        assert not found, f"{command} {_shown(arguments)} leaked Python internals: {found}"
        echoed = echoes(arguments, messages)
        assert not echoed, f"{command} {_shown(arguments)} echoed the client's input at length: {echoed}"


def _shown(arguments: Any) -> str:
    return json.dumps(arguments, default=str)[:600]


def spawn(schema: SchemaCheck) -> Debugger:
    """A server whose files stay in the sandbox: relative paths, and the fix knowledge base repair writes."""
    messages: list[dict] = []
    saved = os.environ.get("REWIND_KNOWLEDGE")
    os.environ["REWIND_KNOWLEDGE"] = str(SANDBOX / "fixes.json")
    try:
        client = DapClient.spawn(observe=_observer(schema, messages), cwd=SANDBOX)
    finally:
        if saved is None:
            del os.environ["REWIND_KNOWLEDGE"]
        else:
            os.environ["REWIND_KNOWLEDGE"] = saved
    return Debugger(client, messages)


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield SANDBOX
    shutil.rmtree(SANDBOX, ignore_errors=True)


@pytest.fixture(scope="module")
def unlaunched(schema):
    debugger = spawn(schema)
    debugger.initialize(supportsProgressReporting=True, supportsInvalidatedEvent=True, supportsMemoryEvent=True)
    yield Prober(debugger)
    debugger.close()


@pytest.fixture(scope="module")
def loaded(schema):
    debugger = spawn(schema)
    assert debugger.start(MODEL, stopOnEntry=True)["reason"] == "entry"
    yield debugger
    debugger.close()


@pytest.fixture(scope="module")
def on_entry(loaded):
    return Prober(loaded)


@pytest.fixture(scope="module")
def at_end(loaded):
    return Prober(loaded)


@pytest.fixture(scope="module")
def on_chip(schema):
    """The model on the sim chip (many units, physical addresses, instructions), stopped on entry."""
    debugger = spawn(schema)
    assert debugger.start(MODEL, driver="sim", stopOnEntry=True)["reason"] == "entry"
    yield Prober(debugger)
    debugger.close()


def go_to(debugger: Debugger, tick: int | None) -> None:
    """Back to `tick` (None: the end) when the previous request moved the session."""
    where = debugger.request("timeline", {"count": 0})
    target = where["end"] if tick is None else tick
    if where["position"] != target:
        mark = debugger.client.mark()
        debugger.request("goto", {"threadId": 1, "targetId": target + 1})
        debugger.client.wait_for("stopped", after=mark, timeout=ANSWER_S)


SETTINGS = dict(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("command", COMMANDS)
def test_before_launch_every_request_is_answered_in_user_terms(unlaunched, command):
    @settings(max_examples=8, **SETTINGS)
    @given(hostile(command))
    def probe(arguments):
        unlaunched.send(command, arguments)

    probe()


@pytest.mark.parametrize("command", COMMANDS)
def test_stopped_on_entry_every_request_is_answered_in_user_terms(on_entry, command):
    @settings(max_examples=20, **SETTINGS)
    @given(hostile(command))
    def probe(arguments):
        go_to(on_entry.debugger, 0)
        on_entry.send(command, arguments)

    probe()


@pytest.mark.parametrize("command", COMMANDS)
def test_at_the_end_every_request_is_answered_in_user_terms(at_end, command):
    @settings(max_examples=8, **SETTINGS)
    @given(hostile(command))
    def probe(arguments):
        go_to(at_end.debugger, None)
        at_end.send(command, arguments)

    probe()


@pytest.mark.parametrize("command", COMMANDS)
def test_on_a_many_core_chip_every_request_is_answered_in_user_terms(on_chip, command):
    @settings(max_examples=6, **SETTINGS)
    @given(hostile(command))
    def probe(arguments):
        on_chip.send(command, arguments)

    probe()


# -- expressions that used to freeze the server or flood the client -----------------------------------
def test_a_huge_power_is_refused_at_once_and_threads_are_answered_meanwhile(on_entry):
    on_entry.new_messages()
    client = on_entry.debugger.client
    started = time.monotonic()
    pending = client.send("evaluate", {"expression": "9**9**9", "context": "repl"})
    assert client.request("threads", timeout=10)["threads"]
    response = pending.wait(10)
    assert not response.success and "digits" in str(response.body) and time.monotonic() - started < 10
    assert not leaks(on_entry.new_messages())


def test_a_huge_string_is_refused_by_its_length(on_entry):
    with pytest.raises(DapError, match="64,000,000"):
        on_entry.debugger.evaluate("'a' * 64 * 10**6")
    assert on_entry.debugger.request("threads")["threads"]


def test_a_long_result_is_cut_with_a_note_of_its_size(on_entry):
    result = on_entry.debugger.evaluate("[1.25] * 60000")["result"]
    assert len(result) < 70 * 1024 and "truncated" in result and "KiB of text" in result


# 28 outer products of 8192 x 8192 (256 MiB each, just within the limits): several seconds of work
SLOW = " + ".join(["(x.flatten()[[0]*8192][:, None] * x.flatten()[[1]*8192]).sum()"] * 28)


def test_pause_stops_a_running_evaluation(on_entry):
    client = on_entry.debugger.client
    started = time.monotonic()
    pending = client.send("evaluate", {"expression": SLOW, "context": "repl"})
    time.sleep(0.3)
    client.request("pause", {"threadId": 1})
    response = pending.wait(ANSWER_S)
    assert not response.success and str(response.body) == "evaluation stopped (pause)"
    assert on_entry.debugger.number("x.sum() * 0") == 0  # the next evaluation is not stopped
    assert time.monotonic() - started < ANSWER_S


def test_cancelling_a_running_evaluation_stops_it(on_entry):
    client = on_entry.debugger.client
    pending = client.send("evaluate", {"expression": SLOW, "context": "repl"})
    time.sleep(0.3)
    client.request("cancel", {"requestId": pending.seq})
    response = pending.wait(ANSWER_S)
    assert not response.success and "stopped" in str(response.body)
    assert on_entry.debugger.number("x.sum() * 0") == 0


def test_a_read_of_a_trillion_bytes_is_answered_with_what_exists(on_entry):
    body = on_entry.debugger.request("readMemory", {"memoryReference": "rewind-value:x", "count": 10**12})
    data = base64.b64decode(body.get("data", ""))
    assert len(data) == 3 * 8 * 4 and body["unreadableBytes"] == 10**12 - len(data)


# -- arguments that reached Python's own errors -------------------------------------------------------
def test_launch_with_a_spill_folder_that_is_a_file_names_the_option(unlaunched):
    unlaunched.new_messages()
    arguments = {"program": str(MODEL), "driver": "torch:cpu",
                 "checkpoint": {"hostMB": 1, "diskMB": 1, "spillDir": str(SANDBOX / "a-file.txt")}}
    with pytest.raises(DapError, match=r"checkpoint\.spillDir .*a-file\.txt is a file, not a folder"):
        unlaunched.debugger.request("launch", arguments)
    assert not leaks(unlaunched.new_messages())


def test_a_thread_that_does_not_exist_is_named(on_entry):
    with pytest.raises(DapError, match=r"no thread 1000000000000: this program's threads are 1\.\.1"):
        on_entry.debugger.request("stackTrace", {"threadId": 10**12})
    with pytest.raises(DapError, match="no thread 0"):
        on_entry.debugger.request("next", {"threadId": 0})


def test_variables_refuses_negative_and_oversized_pages(on_entry):
    scope = on_entry.debugger.request("scopes", {"frameId": 1})["scopes"][-1]["variablesReference"]
    with pytest.raises(DapError, match="cannot be negative"):
        on_entry.debugger.request("variables", {"variablesReference": scope, "start": 0, "count": -5})
    with pytest.raises(DapError, match="more than one page"):
        on_entry.debugger.request("variables", {"variablesReference": scope, "count": 10**12})


def test_set_variable_with_a_superscript_index_is_not_an_element(on_entry):
    debugger = on_entry.debugger
    on_entry.new_messages()
    weight = next(v for v in debugger.scope("Parameters") if v["name"] == "p_fc1_weight")
    row = debugger.variables(weight["variablesReference"], filter="indexed", start=0, count=1)[0]
    with pytest.raises(DapError, match=r"'\[²\]' is not an element"):
        debugger.request("setVariable", {"variablesReference": row["variablesReference"], "name": "[²]",
                                         "value": "1"})
    with pytest.raises(DapError, match=r"a number of 401 digits does not fit in an element of .p_fc1_weight."):
        debugger.request("setVariable", {"variablesReference": row["variablesReference"], "name": "[0]",
                                         "value": "10**400"})
    assert not leaks(on_entry.new_messages())


def test_a_source_path_with_a_nul_names_no_file(on_entry):
    with pytest.raises(DapError, match="contains a NUL character"):
        on_entry.debugger.request("setBreakpoints", {"source": {"path": "/tmp/a\x00b.py"}, "breakpoints": []})
