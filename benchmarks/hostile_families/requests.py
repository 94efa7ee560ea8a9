"""requests: every registered request with seeded extreme arguments, in three states of a stdio session.

The states: before launch (after initialize), stopped on entry of tests/models/hostile.py build, and at its end.
The arguments follow each request's model, leaning on the extremes: integers past 64 bits, NaN and infinities,
200 000-character and odd strings, hostile paths, values of the wrong type, nesting, missing and extra fields.
Values the engine pipe cannot carry (integers beyond 64 bits, lone surrogates) are first probed once each.
disconnect and terminate are sent only with arguments their model refuses (they would end the session).

Handled: the request is answered (a refusal with a message), a motion's stopped/terminated event comes, and
`threads` is answered afterwards. Crash: the server exits or the connection dies. Hang: no answer within
--timeout. Leak: an answer names a Python exception class the arguments did not contain.
"""

from __future__ import annotations

import importlib
import math
import random
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .common import Family, Outcome, SetupError, StdioSession, Wire, Check, Crash, Hang, nested, preview, \
    random_json

importlib.import_module("dap_server.dispatch")  # importing the dispatcher registers every request
from dap_server.requests import REQUESTS  # noqa: E402

TITLE = "request fuzz (3 states)"
BUDGET_S = (150, 45)  # (default, --quick) seconds
MOTIONS = {"continue", "reverseContinue", "next", "stepIn", "stepOut", "stepBack", "goto", "restart",
           "configurationDone", "restoreCheckpoint"}
ENDERS = {"disconnect", "terminate"}  # fuzzed only with arguments that are refused: they end the session
INTS = [0, -1, 1, 2, 3, 5, 2**31 - 1, 2**31, -2**31, 10**6, 10**12, 2**53 + 1, 2**63 - 1, 2**63, -2**63]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e308, -1e308, 5e-324, math.nan, math.inf, -math.inf]
VALUE_NAMES = ["x", "p_fc_weight", "p_fc_bias", "linear", "relu", "mul", "h", "fc"]
# Values the engine pipe (msgpack) cannot carry: each state first sends one request with each; a class whose probe
# ended the connection is left out of that state's other requests (restarting a launched server after every one
# would eat the budget, and the probe already shows the failure).
WIDE = {"an integer beyond 64 bits": [2**64, 10**30, -2**63 - 1, 2**70], "a lone surrogate": ["x\ud800y", "\udfff"]}
STRINGS = ["", " ", "x", "\x00", "a\x00b", "é🙂\u202e\ufeff", "a" * 200_000, "0x0", "0x" + "f" * 30, "-1",
           "1e999", "rewind-value:", "rewind-value:x", "rewind-value:" + "z" * 300, *VALUE_NAMES, "9**9**9",
           "'a' * 64 * 10**6", "(" * 150 + ")" * 150, "{x}", "{9**9**9}", "%s%n%x", "nan", "original", "float64",
           "torch:cpu", "torch:cuda:99", "sim", "line", "instruction", "==3", "%0", "linear:1", "../../../etc/passwd",
           "$(touch /tmp/x)", "__class__", "p_fc_weight[0]", "aten.linear.default"]
WRONG = [None, True, "text", 1.5, [], {}, [1, "a"], {"a": 1}, 2**64 - 1, -1, "", nested(50)]
PATH_FIELDS = {"path", "record", "trace", "spillDir", "knowledge", "program", "reference", "file", "directory"}


class ArgumentMaker:
    """Seeded hostile values for a pydantic model's fields, leaning on the extremes."""

    def __init__(self, rng: random.Random, sandbox: Path):
        self.rng = rng
        self.wide: dict[str, list] = dict(WIDE)  # the classes of WIDE values still drawn
        self.paths = [str(sandbox / "out.rwtrace"), str(sandbox / "a-file.txt"), str(sandbox / "a-folder"),
                      str(sandbox / "missing" / "deeper" / "x.rwtrace"), str(sandbox / "a-file.txt" / "under"),
                      str(sandbox / ("n" * 300)), str(sandbox / "nul\x00.rwtrace"), "", "relative.rwtrace",
                      str(sandbox / "a-folder" / "written-by-a-request.rwtrace")]

    def junk(self, depth: int = 3) -> Any:
        return random_json(self.rng, depth)

    def of_type(self, annotation: Any, name: str = "", depth: int = 0) -> Any:
        rng = self.rng
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if annotation is Any:
            return self.junk()
        if origin is typing.Union or type(annotation).__name__ == "UnionType":
            return self.of_type(rng.choice(args), name, depth)
        if origin is typing.Literal:
            return rng.choice(args)
        if origin in (list, typing.List, tuple):
            item = args[0] if args else Any
            return [self.of_type(item, name, depth + 1) for _ in range(rng.choice([0, 1, 2, 3, 200] if depth < 1
                                                                                 else [0, 1]))]
        if origin in (dict, typing.Dict) or annotation is dict:
            return {rng.choice(["a", "eps", "", "x" * 70, "__class__"]): self.junk(2) for _ in range(rng.randint(0, 2))}
        if annotation is type(None):
            return None
        if annotation is bool:
            return rng.choice([True, False])
        return self.of_scalar(annotation, name, depth)

    def of_scalar(self, annotation: Any, name: str, depth: int) -> Any:
        rng = self.rng
        wide_ints = self.wide.get("an integer beyond 64 bits", [])
        if annotation is int:
            return rng.choice(INTS + wide_ints) if rng.random() < 0.7 else rng.randint(-3, 40)
        if annotation is float:
            return rng.choice(FLOATS + INTS + wide_ints)
        if annotation is str:
            if name in PATH_FIELDS:
                return rng.choice(self.paths)
            return rng.choice(STRINGS + self.wide.get("a lone surrogate", [])) if rng.random() < 0.8 else "".join(
                chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000)]))
                for _ in range(rng.randint(0, 12)))
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return self.arguments(annotation, depth + 1)
        return self.junk()

    def arguments(self, model: type[BaseModel], depth: int = 0) -> dict:
        out = {}
        for name, info in model.model_fields.items():
            key = info.alias or name
            roll = self.rng.random()
            if roll < 0.65:
                out[key] = self.of_type(info.annotation, key, depth)
            elif roll < 0.85:
                out[key] = self.rng.choice(WRONG)
            # else: missing
        if self.rng.random() < 0.15:
            out[self.rng.choice(["extra", "tik", "__class__", "x" * 100])] = self.junk(2)
        return out

    def hostile(self, command: str) -> Any:
        if self.rng.random() < 0.1:
            return self.rng.choice([None, [], "arguments", 7, [{"a": 1}], nested(60)])
        return self.arguments(REQUESTS[command].arguments)

    def refused(self, command: str, arguments: Any) -> tuple[bool, Any]:
        """Arguments the request's model refuses, drawn up to 50 times; (False, the last) when none was."""
        for _ in range(50):
            if refused_locally(command, arguments):
                return True, arguments
            arguments = self.hostile(command)
        return False, arguments


def refused_locally(command: str, arguments: Any) -> bool:
    try:
        REQUESTS[command].parse(arguments)
    except Exception:  # noqa: BLE001 -- whatever the model refuses, the server refuses too
        return True
    return False


def wide_probe(i: str) -> dict:
    """The evaluate that carries the first value of a WIDE class (`i` is "with <class>")."""
    what = i.removeprefix("with ")
    arguments = {"expression": "x", "context": "repl", "frameId": 1, "format": {"hex": False}}
    if what == "a lone surrogate":
        arguments["expression"] = WIDE[what][0]
    else:
        arguments["frameId"] = WIDE[what][0]
    return arguments


def prepare(fam: Family, wire: Wire, state: str) -> None:
    """Back to the state: at tick 0 (stopped on entry) or at the end."""
    if state == "before launch":
        return
    probe = Check(fam, "prepare", "")
    timeline = probe.request(wire, "timeline", {"count": 0})
    if not timeline.get("success"):
        raise SetupError(f"timeline refused: {timeline.get('message')}")
    position, end = timeline["body"]["position"], timeline["body"]["end"]
    target = 0 if state == "stopped on entry" else end
    if position != target:
        if probe.motion(wire, "goto", {"threadId": 1, "targetId": target + 1}) is None:
            if probe.motion(wire, "restart", {}) is None:
                raise SetupError("neither goto nor restart brought the session back")


class Fuzz:
    """The request fuzz: one stdio session taken through the states, a fresh server after an input breaks it."""

    def __init__(self, fam: Family):
        self.fam = fam
        self.maker = ArgumentMaker(fam.rng, fam.ctx.sandbox)
        self.session = StdioSession(fam, "", "", launched=False)
        self.skipped: set[str] = set()  # enders whose refused arguments ended the connection once

    def enter(self, state: str) -> bool:
        """The session in `state`: a fresh server, except at the end of a launched session that still stands."""
        s = self.session
        s.label = f"{state}: setup"
        s.launched = state != "before launch"
        s.repro = "initialize, launch hostile.py build" if s.launched else "initialize"
        if state == "at the end" and s.wire is not None and s.wire.ended is None:
            return True
        return s.renew(state)

    def plan(self, count: int) -> list[tuple[str, Any]]:
        """The WIDE probes, then each request `count` times (a sample with --quick)."""
        plan: list[tuple[str, Any]] = [("evaluate", f"with {what}") for what in self.maker.wide]
        plan += [(command, i) for command in sorted(REQUESTS) for i in range(count)]
        if self.fam.ctx.quick:
            plan = plan[:len(self.maker.wide)] + self.fam.rng.sample(plan[len(self.maker.wide):], 25)
        return plan

    def run_state(self, state: str, count: int) -> None:
        for command, i in self.plan(count):
            if self.fam.out_of_time():
                continue
            arguments = self.maker.hostile(command)
            if isinstance(i, str):
                arguments = wide_probe(i)
            if command in self.skipped:
                continue
            if command in ENDERS:
                refused, arguments = self.maker.refused(command, arguments)
                if not refused:
                    continue
            if not self.back_to(state, command):
                break
            outcome = self.fuzz(state, command, i, arguments)
            self.learn(state, command, i, outcome)
            if outcome.broke and not self.session.renew(state):
                break

    def back_to(self, state: str, command: str) -> bool:
        try:
            prepare(self.fam, self.session.wire, state)
        except (Crash, Hang, SetupError) as exc:
            self.fam.notes.append(f"{state}: could not return to the state before {command} ({exc}); "
                                  "a fresh server takes over")
            return self.session.renew(state)
        return True

    def fuzz(self, state: str, command: str, i: int | str, arguments: Any) -> Outcome:
        wire = self.session.wire
        where = "after initialize" if state == "before launch" else \
            f"hostile.py build launched (stopOnEntry), {state}"
        repro = f"stdio server, {where}: request {command} with arguments {preview(arguments, 400)}; then threads"
        with self.fam.check(f"{state}: {command} #{i}", repro) as chk:
            mark = wire.mark()
            response = chk.request(wire, command, arguments)
            if response.get("success") and command in MOTIONS:
                wire.wait_event(("stopped", "terminated"), mark, chk.timeout)
            chk.threads(wire)
        return chk.outcome

    def learn(self, state: str, command: str, i: int | str, outcome: Outcome) -> None:
        """What ended a connection is not sent again."""
        if command in ENDERS and outcome.crash:
            self.skipped.add(command)
            self.fam.notes.append(f"{state}: a {command} refused for its arguments ended the connection: not sent "
                                  "again")
        if isinstance(i, str) and outcome.crash:
            self.maker.wide.pop(i.removeprefix("with "), None)
            self.fam.notes.append(f"{state}: a request {i} ended the connection: such values are left out of the "
                                  "other requests (and states)")


def run(fam: Family) -> None:
    fuzz = Fuzz(fam)
    per_state = {"before launch": fam.n(3, 1), "stopped on entry": fam.n(5, 1), "at the end": fam.n(3, 1)}
    for state, count in per_state.items():
        if fuzz.enter(state):
            fuzz.run_state(state, count)
    fuzz.session.close()
