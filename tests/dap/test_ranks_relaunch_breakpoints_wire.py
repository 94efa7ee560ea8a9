"""A relaunch of ranks keeps the client's breakpoints, through the wire (docs/ranks.md, "Through DAP",
"Breakpoints"): `restart` with launch arguments starts new ranks, and the session sets every breakpoint the client
set (lines, functions, exception filters, data; instructions too, which the torch chip of ranks refuses) on them
again, under the ids the client was given; a breakpoint whose answer changed on the new ranks (its verification, its
line) is told in a `breakpoint` event. The pipeline-parallel example on 2 stages; one server for the module."""

from __future__ import annotations

import pytest

from tests.conftest import EXAMPLES, MODELS, line_of
from tests.dap.wire import Debugger, Server

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
PIPELINE = EXAMPLES / "pipeline_parallel.py"
NAN = MODELS / "ranks" / "planted_nan_rank.py"  # rank 1 makes a NaN; it has a tanh too, and no line of PIPELINE
SEND = line_of(PIPELINE, "# SEND")
LAUNCH = {"program": str(PIPELINE), "driver": "torch:cpu", "stopOnEntry": True, "ranks": 2}


@pytest.fixture(scope="module")
def pipeline(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(PIPELINE, stopOnEntry=True, ranks=2)["reason"] == "entry"
    yield Server(debugger, LAUNCH)
    debugger.close()


@pytest.fixture
def entry(pipeline: Server) -> Debugger:
    """No breakpoints, the default NaN filter, the pipeline on entry."""
    debugger = pipeline.debugger
    debugger.set_breakpoints(PIPELINE, [])
    for kind in ("setFunctionBreakpoints", "setDataBreakpoints"):
        debugger.request(kind, {"breakpoints": []})
    debugger.request("setExceptionBreakpoints", {"filters": ["nan"]})
    return pipeline.launch(LAUNCH)


def _stops(debugger: Debugger) -> list[tuple]:
    """Every stop of continuing to the end: its reason, thread, the breakpoints it names, and its words."""
    stops = [debugger.motion("continue", {"threadId": 1})]
    while stops[-1]["reason"] not in ("end", "exception"):
        stops.append(debugger.motion("continue", {"threadId": 1}))
    return [(s["reason"], s["threadId"], s.get("hitBreakpointIds"), s["description"]) for s in stops]


def _relaunch(pipeline: Server, arguments: dict) -> list[dict]:
    """`restart` with `arguments` (new ranks, even for the same ones); the breakpoints its `breakpoint` events said
    changed."""
    debugger, pipeline.arguments = pipeline.debugger, None  # a refused relaunch leaves no launch
    mark = debugger.client.mark()
    assert debugger.motion("restart", {"arguments": arguments})["reason"] == "entry"
    pipeline.arguments = arguments
    return [body["breakpoint"] for name, body in debugger.client.events_since(mark)
            if name == "breakpoint" and body["reason"] == "changed"]


def _hit(stops: list[tuple]) -> set[int]:
    return {bp for stop in stops for bp in stop[2] or ()}


def test_a_relaunch_stops_where_the_first_launch_did_naming_the_ids_the_client_was_given(pipeline, entry):
    line, = entry.set_breakpoints(PIPELINE, [{"line": SEND}])  # rank 0's sends
    function, = entry.request("setFunctionBreakpoints", {"breakpoints": [{"name": "aten.tanh"}]})["breakpoints"]
    data, = entry.request("setDataBreakpoints", {"breakpoints": [{"dataId": "rank1:tanh_1"}]})["breakpoints"]
    assert [bp["verified"] for bp in (line, function, data)] == [True, True, True]
    first = _stops(entry)
    assert _hit(first) == {line["id"], function["id"], data["id"]} and first[-1][0] == "end"
    assert entry.motion("restart", {})["reason"] == "entry"  # the same ranks, back to their beginning
    assert _stops(entry) == first
    assert _relaunch(pipeline, LAUNCH) == []  # new ranks: every breakpoint bound as before, so none changed
    assert _stops(entry) == first


def test_a_relaunch_into_another_program_says_which_breakpoints_changed_and_keeps_the_exception_filters(
        pipeline, entry):
    line, = entry.set_breakpoints(PIPELINE, [{"line": SEND}])
    function, = entry.request("setFunctionBreakpoints", {"breakpoints": [{"name": "aten.tanh"}]})["breakpoints"]
    data, = entry.request("setDataBreakpoints", {"breakpoints": [{"dataId": "rank1:tanh_1"}]})["breakpoints"]
    entry.request("setExceptionBreakpoints", {"filters": []})  # no NaN filter: rank 1's NaN must not stop
    changed = _relaunch(pipeline, {**LAUNCH, "program": str(NAN)})  # its one tanh: the function's stays verified
    assert [(bp["id"], bp["verified"]) for bp in changed] == [(line["id"], False), (data["id"], False)]
    assert "no node of the program comes from" in changed[0]["message"]
    assert changed[0]["source"]["path"] == str(PIPELINE) and "no value named 'tanh_1'" in changed[1]["message"]
    stops = _stops(entry)
    assert [s[:3] for s in stops] == [("function breakpoint", 1, [function["id"]]), ("end", 1, None)]
    changed = _relaunch(pipeline, LAUNCH)
    assert [(bp["id"], bp["verified"], bp.get("line")) for bp in changed] == \
        [(line["id"], True, SEND), (data["id"], True, None)]
    entry.request("setFunctionBreakpoints", {"breakpoints": []})
    stop = entry.motion("continue", {"threadId": 1})
    assert (stop["reason"], stop["threadId"], stop["hitBreakpointIds"]) == ("breakpoint", 1, [line["id"]])


def test_a_relaunch_into_the_trace_index_of_the_run_stops_at_the_same_breakpoints(pipeline, entry, tmp_path):
    line, = entry.set_breakpoints(PIPELINE, [{"line": SEND}])
    function, = entry.request("setFunctionBreakpoints", {"breakpoints": [{"name": "aten.tanh"}]})["breakpoints"]
    live = _stops(entry)  # every rank to its end: the whole run is recorded
    assert _hit(live) == {line["id"], function["id"]}
    index = tmp_path / "run.rwtrace"
    entry.request("saveTrace", {"path": str(index)})
    assert _relaunch(pipeline, {"trace": str(index), "stopOnEntry": True}) == []
    assert [s[:3] for s in _stops(entry)] == [s[:3] for s in live]
