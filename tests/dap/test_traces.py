"""Traces through the wire: save a live session's trace, open it in a fresh server with no driver,
and get the same answers; record while running; damaged traces are clear errors."""


import pytest

from checkpoint.trace import TraceReader
from dap_server.client import DapError
from tests.dap.wire import GPT, Debugger, line_of

MASK = line_of("scores = scores.masked_fill")


def snapshot(debugger: Debugger) -> dict:
    """What a user sees when stopped: the frames, every scope's variables, a provenance answer."""
    frames = debugger.request("stackTrace", {"threadId": 1})["stackFrames"]
    scopes = debugger.request("scopes", {"frameId": frames[0]["id"]})["scopes"]
    variables = {}
    for scope in scopes:
        got = debugger.request("variables", {"variablesReference": scope["variablesReference"]})["variables"]
        variables[scope["name"]] = [(v["name"], v["value"]) for v in got]
    scores = debugger.request("evaluate", {"expression": "scores.abs().max()", "frameId": frames[0]["id"],
                                           "context": "watch"})["result"]
    prov = debugger.request("provenance", {"name": "div"})
    return {"frames": [(f["name"], f["line"]) for f in frames], "variables": variables, "scores": scores,
            "writer": prov["lastWriter"]["node"], "lineage": prov["lineage"]}


@pytest.fixture(scope="module")
def saved(schema, tmp_path_factory):
    path = tmp_path_factory.mktemp("dap-trace") / "gpt.rwtrace"
    live = Debugger.spawn(schema)
    first = live.start(GPT, [MASK], checkpoint={"budgetMB": 0.05})
    answers = [(first["reason"], snapshot(live))]
    stop = live.motion("continue")
    answers.append((stop["reason"], snapshot(live)))
    live.motion("stepBack")
    answers.append(("step back", snapshot(live)))
    live.motion("continue")
    live.motion("continue")  # to the end
    info = live.request("saveTrace", {"path": str(path)})
    assert info["path"] == str(path) and info["bytes"] == path.stat().st_size
    live.close()
    return path, answers


def test_saved_trace_opens_in_a_fresh_server_with_the_same_answers(schema, saved):
    path, answers = saved
    trace = Debugger.spawn(schema)
    first = trace.start(GPT, [MASK], trace=str(path), checkpoint={"budgetMB": 0.05})
    assert (first["reason"], snapshot(trace)) == answers[0]
    trace.motion("continue")
    assert snapshot(trace) == answers[1][1]
    trace.motion("stepBack")
    assert snapshot(trace) == answers[2][1]
    trace.motion("reverseContinue")
    assert snapshot(trace) == answers[0][1]
    source = trace.request("source", {"source": {"path": str(GPT)}, "sourceReference": 0})["content"]
    assert source == GPT.read_text()
    trace.close()


def test_launch_with_record_writes_a_trace_that_opens(schema, tmp_path):
    path = tmp_path / "recorded.rwtrace"
    live = Debugger.spawn(schema)
    live.start(GPT, [MASK], record=str(path))
    live.motion("continue")
    live.close()  # disconnect: the recording gets its index and footer
    assert TraceReader(path).contents.warnings == []
    trace = Debugger.spawn(schema)
    stop = trace.start(GPT, [MASK], trace=str(path))
    assert stop["reason"] == "breakpoint"
    frames = trace.request("stackTrace", {"threadId": 1})["stackFrames"]
    assert frames[0]["line"] == MASK
    trace.close()


def test_bad_traces_and_bad_launches_are_clear_errors_and_the_server_keeps_serving(schema, tmp_path):
    debugger = Debugger.spawn(schema)
    debugger.initialize()
    bad = tmp_path / "bad.rwtrace"
    bad.write_bytes(b"RWNDTRC\0" + (1).to_bytes(4, "little") + bytes(4) + b"\x05\x00\x00\x00garbage!!")
    with pytest.raises(DapError, match=r"offset 16"):
        debugger.request("launch", {"trace": str(bad)})
    with pytest.raises(DapError, match="trace file not found"):
        debugger.request("launch", {"trace": str(tmp_path / "none.rwtrace")})
    for path, words in (("bad\0.rwtrace", "the path contains a NUL character"),
                        ("/proc/self/mem", "at offset 0: Input/output error")):  # opens, and fails to read
        with pytest.raises(DapError, match=words) as caught:
            debugger.request("launch", {"trace": path})
        assert "Rewind" not in caught.value.message  # words, not "a bug in Rewind"
    with pytest.raises(DapError, match="exactly one of 'program'"):
        debugger.request("launch", {"program": str(GPT), "trace": str(bad)})
    with pytest.raises(DapError, match="exactly one of 'program'"):
        debugger.request("launch", {})
    debugger.request("launch", {"program": str(GPT), "driver": "torch:cpu"})  # still serving
    assert debugger.request("threads")["threads"]
    debugger.close()
