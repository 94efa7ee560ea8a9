"""Stepping as a Python user expects, through the wire: a loop's body line runs once per iteration (breakpoints, hit
counts, next, stepBack, goto targets), a breakpoint on the first line that runs stops at launch, an edit is a step
the client hears of, a request numbered 0 is answered, file URIs name sources, and scopes say what they are."""

import json
import re
import time

import pytest

from tests.dap.wire import MODELS, DapError, Debugger, named, rewind

LOOP = MODELS / "layer_loop.py"
LINES = LOOP.read_text().splitlines()


def line(text: str) -> int:
    return next(i + 1 for i, source in enumerate(LINES) if text in source)


BODY = line("x = torch.relu(layer(x))")  # under `for layer in self.layers` (four nn.Linear)
MIX = line("x = self.mix(x)")  # under `for _ in range(2)`: the same module twice
TWO_CALLS = line("x = self.b(self.a(x))")  # two nn.Linear on one line, in no loop: one execution
FIRST = line("x = x * self.scale")  # tick 0


@pytest.fixture(scope="module")
def loop_server(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(LOOP, stopOnEntry=True)["reason"] == "entry"
    yield debugger
    debugger.close()


@pytest.fixture
def loop(loop_server: Debugger) -> Debugger:
    loop_server.reset(LOOP)
    return loop_server


def test_a_loop_body_line_is_a_goto_target_per_iteration(loop):
    targets = loop.request("gotoTargets", {"source": {"path": str(LOOP)}, "line": BODY})["targets"]
    assert [t["label"].split(":")[0] for t in targets] == ["tick 1", "tick 3", "tick 5", "tick 7"]
    assert [t["label"].rsplit(" in ", 1)[1] for t in targets] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    mixed = loop.request("gotoTargets", {"source": {"path": str(LOOP)}, "line": MIX})["targets"]
    assert len(mixed) == 2  # the same module, the same path, twice: two iterations still
    assert len(loop.request("gotoTargets", {"source": {"path": str(LOOP)}, "line": TWO_CALLS})["targets"]) == 1


def test_a_breakpoint_in_a_loop_stops_once_per_iteration_and_hit_counts_count_iterations(loop):
    loop.set_breakpoints(LOOP, [{"line": BODY}])
    stops = []
    while (stop := loop.motion("continue"))["reason"] == "breakpoint":
        stops.append(loop.position())
    assert stops == [1, 3, 5, 7] and stop["reason"] == "end"
    loop.reset(LOOP)
    loop.set_breakpoints(LOOP, [{"line": BODY, "hitCondition": "==3"}])
    assert loop.motion("continue")["reason"] == "breakpoint" and loop.position() == 5
    assert loop.top()["name"].startswith("linear_2 ")


def test_next_and_step_back_go_an_iteration_at_a_time_and_x_is_each_iterations(loop):
    loop.motion("next")
    seen = []
    while loop.top()["line"] == BODY:
        seen.append((loop.position(), loop.evaluate("x")["result"]))
        loop.motion("next")
    assert [tick for tick, _ in seen] == [1, 3, 5, 7]
    assert len({shown for _, shown in seen}) == 4  # x is the value the iteration reads, not the first one's
    assert loop.top()["line"] == MIX and loop.position() == 9
    assert loop.motion("next") and loop.position() == 10 and loop.top()["line"] == MIX
    assert loop.motion("next") and loop.position() == 11 and loop.top()["line"] == TWO_CALLS
    assert loop.motion("next") and loop.position() == 13  # over both calls of the line at once
    back = []
    while loop.position() > 0:
        loop.motion("stepBack")
        back.append(loop.position())
    assert back == [11, 10, 9, 7, 5, 3, 1, 0]


def test_a_breakpoint_on_the_first_line_that_runs_stops_at_launch(schema):
    debugger = Debugger.spawn(schema)
    try:
        stop = debugger.start(LOOP, breakpoints=[FIRST])
        assert stop["reason"] == "breakpoint" and debugger.position() == 0
        assert debugger.top()["line"] == FIRST
        assert debugger.motion("continue")["reason"] == "end"
    finally:
        debugger.close()


def test_set_variable_is_a_step_the_client_hears_and_stepping_back_shows_the_edit_at_its_line(loop):
    loop.set_breakpoints(LOOP, [{"line": BODY}])
    loop.motion("continue")
    loop.set_breakpoints(LOOP, [])
    x = named(loop.scope("Locals"), "x")
    row = named(loop.variables(x["variablesReference"]), "[0]")
    before = loop.position()
    mark = loop.client.mark()
    answer = loop.request("setVariable", {"variablesReference": row["variablesReference"], "name": "[1]",
                                          "value": "5"})
    assert answer["value"] == "5"
    stop = loop.client.wait_for("stopped", after=mark)
    order = [m.get("event") or m.get("type") + " " + m.get("command") for m in loop.messages]
    assert order.index("response setVariable", len(order) - 8) < len(order) - 1 - order[::-1].index("stopped")
    assert stop["reason"] == "step" and "edit" in stop["description"]
    assert loop.position() == before + 1
    assert loop.top()["line"] == BODY and loop.top()["name"].startswith("linear ")  # the node about to run
    assert loop.number("x[0, 1]") == 5.0
    loop.motion("stepBack")
    edit = loop.top()
    assert edit["name"].startswith("edit of ") and edit["line"] == FIRST  # where the edited value was computed
    assert edit["source"]["path"] == str(LOOP)
    assert loop.number("x[0, 1]") != 5.0  # before the edit runs, x is what the program computed


def test_a_request_numbered_zero_is_answered_and_a_negative_one_refused_in_words(schema):
    debugger = Debugger.spawn(schema)
    try:
        for seq in (0, -4):
            body = json.dumps({"seq": seq, "type": "request", "command": "initialize",
                               "arguments": {"adapterID": "rewind"}}).encode()
            debugger.client.write_raw(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.time() + 30
        answers: dict[int, dict] = {}
        while len(answers) < 2 and time.time() < deadline:
            answers = {m["request_seq"]: m for m in list(debugger.messages) if m.get("type") == "response"}
            time.sleep(0.05)
        assert answers[0]["success"] and answers[0]["body"]["supportsStepBack"]
        assert not answers[-4]["success"] and "'seq' of 0 or more" in answers[-4]["message"]
    finally:
        debugger.close()


def test_file_uris_name_sources(loop):
    uri = LOOP.as_uri()
    (bp,) = loop.request("setBreakpoints", {"source": {"path": uri}, "breakpoints": [{"line": BODY}]})["breakpoints"]
    assert bp["verified"]
    targets = loop.request("gotoTargets", {"source": {"path": uri}, "line": BODY})["targets"]
    assert len(targets) == 4
    with pytest.raises(DapError, match="a file on the machine 'elsewhere'"):
        loop.request("gotoTargets", {"source": {"path": "file://elsewhere/model.py"}, "line": BODY})


def test_scopes_say_what_they_hold_and_the_whole_programs_are_fetched_when_opened(loop):
    loop.set_breakpoints(LOOP, [{"line": MIX}])
    assert loop.motion("continue")["reason"] == "breakpoint"
    scopes = {s["name"].split(" ")[0]: s for s in loop.request("scopes", {"frameId": 1})["scopes"]}
    assert scopes["Node"]["presentationHint"] == "registers" and not scopes["Node"]["expensive"]
    assert scopes["Locals"]["presentationHint"] == "locals" and not scopes["Locals"]["expensive"]
    assert scopes["Live"]["expensive"] and scopes["Parameters"]["expensive"]


def test_the_console_breaks_and_steps_per_iteration(tmp_path):
    script = f"break layer_loop.py:{BODY} if x.max() > 0\ncontinue\ncontinue\nnext\nback\nback\nquit\n"
    run = rewind("debug", str(LOOP), "--driver", "torch:cpu", stdin=script)
    assert run.returncode == 0, run.stdout + run.stderr
    stops = re.findall(r"^\[tick (\d+)\] (\w+)", run.stdout, re.MULTILINE)
    assert [tick for tick, _ in stops][-5:] == ["1", "3", "5", "3", "1"]


def test_the_python_api_breaks_and_steps_per_iteration():
    import rewind as api  # the module, beside the console's `rewind` command above

    with api.debug(LOOP, driver="torch:cpu") as session:
        session.breakpoint("layer_loop.py", BODY, hit="==2")
        assert session.run().data["tick"] == 3
        assert session.step().data["tick"] == 5 and session.back().data["tick"] == 3
        assert session.back().data["tick"] == 1


def test_a_reference_the_last_motion_cleared_is_refused_without_a_message_for_the_user(loop):
    """VS Code redraws the previous stop's Variables as a step runs, asking for references the step cleared: the
    refusal says why, but is not shown to the user as their failure (showUser false); other refusals are."""
    stale = loop.request("scopes", {"frameId": 1})["scopes"][0]["variablesReference"]
    loop.motion("next")
    with pytest.raises(DapError, match="unknown or expired"):
        loop.request("variables", {"variablesReference": stale})
    with pytest.raises(DapError, match="no frame"):
        loop.request("scopes", {"frameId": 999})
    refusals = [m for m in loop.messages if m.get("type") == "response" and not m["success"]]
    assert [r["body"]["error"]["showUser"] for r in refusals[-2:]] == [False, True]
