"""Line breakpoints on lines that run on some ranks only, through the wire (docs/ranks.md, "Through DAP"): the
pipeline-parallel example on 2 stages, where rank 0 sends each micro-batch on a line rank 1 runs nothing on, and
rank 1 receives on a line rank 0 runs nothing on. A stop names the client's breakpoint, never a rank's own number
nor its fence (the function breakpoint before each send); a line runs where it has code and is moved on no rank
that has none. One launch for the module."""

from __future__ import annotations

import re

import pytest

from tests.conftest import EXAMPLES, line_of
from tests.dap.wire import Debugger

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
PIPELINE = EXAMPLES / "pipeline_parallel.py"
MICRO = 2  # micro-batches: rank 0 sends twice
SEND, RECV, STACK, ENERGY = (line_of(PIPELINE, marker) for marker in ("# SEND", "# RECV", "torch.stack(", "# ENERGY"))
ELSE = line_of(PIPELINE, "else:  # the previous stage's")  # no code on any rank: rank 1's recv is the next line
APPEND = line_of(PIPELINE, "outs.append(h)")  # no code on any rank: the stack after it runs on both
BLANK = line_of(PIPELINE, "def build") - 1  # between two functions: no line to move to


@pytest.fixture(scope="module")
def pipeline(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(PIPELINE, stopOnEntry=True, ranks=2)["reason"] == "entry"
    yield debugger
    debugger.close()


@pytest.fixture
def entry(pipeline: Debugger) -> Debugger:
    pipeline.set_breakpoints(PIPELINE, [])
    pipeline.request("setFunctionBreakpoints", {"breakpoints": []})  # each rank numbers its fences anew: its ids
    assert pipeline.motion("restart", {})["reason"] == "entry"  # run ahead of the session's
    return pipeline


def _line(debugger: Debugger, thread: int) -> int:
    return debugger.request("stackTrace", {"threadId": thread})["stackFrames"][0]["line"]


def _stops(debugger: Debugger) -> list[dict]:
    """Every stop of continuing to the end."""
    stops = [debugger.motion("continue", {"threadId": 1})]
    while stops[-1]["reason"] != "end":
        stops.append(debugger.motion("continue", {"threadId": 1}))
    return stops


def test_a_stop_at_a_send_names_the_clients_breakpoint_and_not_the_ranks_fence(entry):
    bp, = entry.set_breakpoints(PIPELINE, [{"line": SEND}])
    stop = entry.motion("continue", {"threadId": 1})  # the send is a fence too: both hold at its node
    assert (stop["reason"], stop["threadId"], stop["hitBreakpointIds"]) == ("breakpoint", 1, [bp["id"]])
    said = stop["description"].rpartition(" (rank 0 at tick")[0]
    assert said == f"rank 0: breakpoint {bp['id']} at pipeline_parallel.py:{SEND}"  # no fence, no rank's number


def test_a_line_one_rank_runs_stops_only_that_rank_there_and_moves_no_other(entry):
    bp, = entry.set_breakpoints(PIPELINE, [{"line": SEND}])
    stops = _stops(entry)
    assert [(s["reason"], s["threadId"], s.get("hitBreakpointIds")) for s in stops] == \
        [("breakpoint", 1, [bp["id"]])] * MICRO + [("end", 1, None)]  # rank 1 never stops: not at the stack either
    events = {thread: [e for e in entry.request("timelineEvents", {"threadId": thread})["events"]
                       if e["event"] == "stop"] for thread in (1, 2)}
    assert [e["breakpoints"] for e in events[1]] == [[bp["id"]]] * MICRO and events[2] == []
    assert all(re.findall(r"breakpoint (\d+)", e["description"]) == [str(bp["id"])] for e in events[1])


def test_breakpoints_two_ranks_hit_in_one_motion_are_both_named_in_its_stop(entry):
    send, recv = entry.set_breakpoints(PIPELINE, [{"line": SEND}, {"line": RECV}])  # rank 0's line, rank 1's line
    stops = _stops(entry)
    hits = [s["hitBreakpointIds"] for s in stops if s["reason"] == "breakpoint"]
    assert sum(h.count(send["id"]) for h in hits) == MICRO  # rank 1 starts on its first recv's line: not a hit
    assert sum(h.count(recv["id"]) for h in hits) == MICRO - 1
    both = next(s for s in stops if s.get("hitBreakpointIds") == sorted([send["id"], recv["id"]]))
    assert re.match(rf"rank \d: breakpoint \d+ at pipeline_parallel.py:\d+; rank \d: breakpoint \d+ at "
                    rf"pipeline_parallel.py:\d+ \(rank 0 at tick", both["description"])


def test_a_rank_only_breakpoint_keeps_its_hit_condition(entry):
    bp, = entry.set_breakpoints(PIPELINE, [{"line": SEND, "hitCondition": "2"}])
    stop = entry.motion("continue", {"threadId": 1})
    assert (stop["threadId"], stop["hitBreakpointIds"], _line(entry, 1)) == (1, [bp["id"]], SEND)
    assert entry.motion("continue", {"threadId": 1})["reason"] == "end"  # the second send was the only hit


def test_a_line_no_rank_runs_moves_as_a_single_session_moves_it_and_binds_only_where_that_line_runs(entry):
    bp, = entry.set_breakpoints(PIPELINE, [{"line": ELSE}])
    assert (bp["verified"], bp["line"]) == (True, RECV)  # not rank 0's next line with code, the linear after it
    stops = _stops(entry)[:-1]
    assert stops and all((s["threadId"], s["hitBreakpointIds"]) == (2, [bp["id"]]) for s in stops)
    bp, = entry.set_breakpoints(PIPELINE, [{"line": APPEND}])
    assert (bp["verified"], bp["line"]) == (True, STACK)  # the next line with code on both ranks
    assert entry.motion("restart", {})["reason"] == "entry"
    stop = entry.motion("continue", {"threadId": 1})
    assert (stop["hitBreakpointIds"], _line(entry, 1), _line(entry, 2)) == ([bp["id"]], STACK, STACK)


def test_set_breakpoints_answers_each_line_where_it_binds_over_the_ranks(entry):
    asked = [SEND, ELSE, APPEND, ENERGY, BLANK, 10_000]
    for arguments in ({"breakpoints": [{"line": n} for n in asked]}, {"lines": asked}):  # `lines`: DAP's old form
        answer = entry.request("setBreakpoints", {"source": {"path": str(PIPELINE)}, **arguments})["breakpoints"]
        assert [(bp["verified"], bp["line"]) for bp in answer] == \
            [(True, SEND), (True, RECV), (True, STACK), (True, ENERGY), (False, BLANK), (False, 10_000)]
        assert len({bp["id"] for bp in answer}) == len(asked)
        send, recv, stack, energy, blank, beyond = (bp.get("message") for bp in answer)
        assert send.startswith("on rank 0 only; rank 1: ") and f"runs at line {SEND}" in send
        assert recv.startswith("on rank 1 only; rank 0: ") and f"runs at line {RECV}" in recv
        assert (stack, energy) == (None, None)  # bound on every rank
        assert f"no node runs at line {BLANK}" in blank and "Error" not in beyond
    bad, = entry.set_breakpoints(PIPELINE, [{"line": SEND, "condition": "h +"}])
    assert not bad["verified"] and "on rank" not in bad["message"]  # refused by every rank alike, in its words
