"""Driving `python -m dap_server` through the wire, with every message it sends checked against the DAP schema."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import debugpy
import pytest
from jsonschema import Draft4Validator

from dap_server.client import DapClient, DapError

ROOT = Path(__file__).resolve().parents[2]
# The DAP schema that ships inside the pinned debugpy package: the suite reads nothing outside the repository.
SPEC = (Path(debugpy.__file__).parent / "_vendored" / "pydevd" / "_pydevd_bundle" / "_debug_adapter"
        / "debugProtocol.json")
GPT = ROOT / "examples" / "gpt.py"
MODELS = ROOT / "tests" / "models"
GPT_LINES = GPT.read_text().splitlines()


def refused(debugger: "Debugger", command: str, arguments: dict, words: str) -> None:
    """The request is refused with `words` in its message, and in words: no Python exception's name."""
    with pytest.raises(DapError) as caught:
        debugger.request(command, arguments)
    assert words in caught.value.message
    assert "Error" not in caught.value.message  # words, not a Python exception's name


def rank_ticks(stop: dict) -> list[int]:
    """Each rank's tick, from a many-rank stop's words: its last bracket (`(rank 0 at tick 3, rank 1 at tick 5)`;
    a goto's own words name its rank's tick before it)."""
    positions = stop["description"].rpartition("(")[2]
    return [int(t) for t in re.findall(r"rank \d+ at tick (\d+)", positions)]


def line_of(text: str, lines: list[str] = GPT_LINES) -> int:
    """The 1-based line of the first source line containing `text` (tests never hard-code line numbers)."""
    return next(i + 1 for i, line in enumerate(lines) if text in line)


def rewind(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run the `rewind` command (the console client and its server) to completion."""
    command = [sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())", *args]
    return subprocess.run(command, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=300)


class SchemaCheck:
    """Validates each message the server sends against its DAP definition; keeps what failed."""

    def __init__(self) -> None:
        self.definitions = json.loads(SPEC.read_text())["definitions"]
        self._validators: dict[str, Draft4Validator] = {}
        self._lock = threading.Lock()
        self.failures: list[str] = []
        self.checked = 0

    def definition(self, message: dict) -> str:
        kind = message.get("type")
        if kind == "response":
            if not message.get("success"):
                return "ErrorResponse"
            name = _capitalised(message.get("command", "")) + "Response"
        elif kind == "event":
            name = _capitalised(message.get("event", "")) + "Event"
        else:
            return "ProtocolMessage"
        if name in self.definitions:
            return name
        return "Response" if kind == "response" else "Event"

    def __call__(self, message: dict) -> None:
        name = self.definition(message)
        with self._lock:
            validator = self._validators.get(name)
            if validator is None:
                validator = Draft4Validator({"$ref": f"#/definitions/{name}", "definitions": self.definitions})
                self._validators[name] = validator
            self.checked += 1
            errors = list(validator.iter_errors(message))
            if errors:
                self.failures.append(f"{name}: {errors[0].message} in {json.dumps(message)[:400]}")


def _capitalised(name: str) -> str:
    return name[:1].upper() + name[1:]


class Debugger:
    """A DapClient with the conveniences scenario tests need; every message seen is kept in `messages`."""

    def __init__(self, client: DapClient, messages: list[dict]):
        self.client, self.messages = client, messages

    @classmethod
    def spawn(cls, schema: SchemaCheck, args: list[str] | None = None) -> "Debugger":
        messages: list[dict] = []
        return cls(DapClient.spawn(args, observe=_observer(schema, messages)), messages)

    @classmethod
    def connect(cls, schema: SchemaCheck, port: int) -> "Debugger":
        messages: list[dict] = []
        return cls(DapClient.connect("127.0.0.1", port, observe=_observer(schema, messages)), messages)

    def request(self, command: str, arguments: dict | None = None, **kw) -> Any:
        return self.client.request(command, arguments, **kw)

    def initialize(self, **capabilities: Any) -> dict:
        return self.request("initialize", {"adapterID": "rewind", "clientID": "tests", "linesStartAt1": True,
                                           "columnsStartAt1": True, "pathFormat": "path", **capabilities})

    def start(self, program: Path, breakpoints: list[int] = (), **launch: Any) -> dict:
        """initialize, launch, set line breakpoints in `program`, configurationDone; the first stop.

        With `trace=FILE` in `launch`, the trace is opened instead (`program` still names the source file
        the breakpoints are set in)."""
        self.initialize(supportsProgressReporting=True, supportsInvalidatedEvent=True, supportsMemoryEvent=True)
        mark = self.client.mark()
        target = {} if "trace" in launch else {"program": str(program), "driver": "torch:cpu"}
        self.request("launch", {**target, **launch})
        self.client.wait_for("initialized", after=mark)
        if breakpoints:
            self.set_breakpoints(program, [{"line": n} for n in breakpoints])
        return self.motion("configurationDone", {})

    def set_breakpoints(self, path: Path, breakpoints: list[dict]) -> list[dict]:
        arguments = {"source": {"path": str(path)}, "breakpoints": breakpoints}
        return self.request("setBreakpoints", arguments)["breakpoints"]

    def motion(self, command: str, arguments: dict | None = None) -> dict:
        """Send a request that moves, and return the stopped event that follows its response."""
        mark = self.client.mark()
        self.request(command, {"threadId": 1} if arguments is None else arguments)
        return self.client.wait_for("stopped", after=mark)

    def reset(self, program: Path = GPT) -> dict:
        """No breakpoints of any kind, the default NaN filter, back at tick 0 (stopped on entry)."""
        self.set_breakpoints(program, [])
        self.request("setFunctionBreakpoints", {"breakpoints": []})
        self.request("setDataBreakpoints", {"breakpoints": []})
        self.request("setExceptionBreakpoints", {"filters": ["nan"]})
        stop = self.motion("restart", {})
        assert stop["reason"] == "entry" and self.position() == 0
        return stop

    def position(self) -> int:
        return self.request("timeline", {"count": 0})["position"]

    def top(self) -> dict:
        return self.request("stackTrace", {"threadId": 1})["stackFrames"][0]

    def evaluate(self, expression: str, context: str = "repl", frame_id: int = 1) -> dict:
        return self.request("evaluate", {"expression": expression, "context": context, "frameId": frame_id})

    def number(self, expression: str) -> float:
        """A scalar expression's value as a float (from the result string: `float32[] cpu = 1.5`)."""
        result = self.evaluate(expression)["result"]
        return float(result.rsplit("=", 1)[-1]) if "=" in result else float(result)

    def scope(self, name: str, frame_id: int = 1) -> list[dict]:
        scopes = self.request("scopes", {"frameId": frame_id})["scopes"]
        found = next(s for s in scopes if s["name"] == name or s["name"].startswith(name + " "))
        return self.variables(found["variablesReference"])

    def variables(self, ref: int, **kw: Any) -> list[dict]:
        return self.request("variables", {"variablesReference": ref, **kw})["variables"]

    def close(self) -> None:
        try:
            self.request("disconnect", {}, timeout=20)
        except (DapError, TimeoutError):
            pass
        self.client.close()


def _observer(schema: SchemaCheck, messages: list[dict]):
    def observe(message: dict) -> None:
        messages.append(message)
        schema(message)
    return observe


def named(variables: list[dict], name: str) -> dict:
    return next(v for v in variables if v["name"] == name)


STATS_RE = re.compile(r"^(?P<dtype>\w+)\[(?P<shape>[\d, ]*)\] (?P<device>\S+) "
                      r"min=\S+ max=\S+ mean=\S+ nan=\d+ inf=\d+$")


class Server:
    """A module's one server: `launch` relaunches it only when it runs another launch (ranks take seconds to
    start), else puts every rank back on entry."""

    def __init__(self, debugger: Debugger, arguments: dict):
        self.debugger, self.arguments = debugger, arguments

    def launch(self, arguments: dict) -> Debugger:
        same, self.arguments = arguments == self.arguments, None  # a refused relaunch leaves no launch
        stop = self.debugger.motion("restart", {} if same else {"arguments": arguments})
        assert stop["reason"] == "entry" and stop["allThreadsStopped"]
        self.arguments = arguments
        return self.debugger


class TcpServer:
    """`python -m dap_server --port 0` in a child process; `port` is the one it printed."""

    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "dap_server", "--port", "0", *args], cwd=str(ROOT),
                                        env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        line = self.process.stderr.readline().decode()
        match = re.search(r"listening on [\d.]+:(\d+)", line)
        assert match, f"the server did not say where it listens: {line!r}"
        self.port = int(match[1])
        threading.Thread(target=self.process.stderr.read, daemon=True).start()  # keep its stderr drained

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
