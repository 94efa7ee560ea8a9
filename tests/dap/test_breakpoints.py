"""Breakpoints through the wire: lines, conditions, hit counts, log points, functions, data, NaN/Inf filters."""

import pytest

from tests.dap.wire import GPT, MODELS, Debugger, line_of

MASK = line_of("mask = torch.ones")  # runs once per block: tick 15 (blocks.0) and 43 (blocks.1)
PLANTED = MODELS / "planted_nan.py"


def test_line_without_a_node_is_unverified_with_a_reason_or_moves_to_the_next_line(fresh):
    shape_line = line_of("batch, tokens, width = x.shape")
    docstring, moved, exact = fresh.set_breakpoints(GPT, [{"line": 3}, {"line": shape_line}, {"line": MASK}])
    assert not docstring["verified"] and "performs no tensor operation" in docstring["message"]
    assert moved["verified"] and moved["line"] == shape_line + 1
    assert exact["verified"] and exact["line"] == MASK
    assert fresh.motion("continue")["reason"] == "breakpoint"
    assert fresh.top()["line"] == shape_line + 1


def test_breakpoint_in_a_file_without_nodes_is_unverified(fresh, tmp_path):
    (bp,) = fresh.set_breakpoints(tmp_path / "other.py", [{"line": 1}])
    assert not bp["verified"] and "no node of the program comes from" in bp["message"]


def test_conditional_breakpoint_stops_only_where_the_condition_holds(fresh):
    first_max = None
    fresh.set_breakpoints(GPT, [{"line": MASK}])
    fresh.motion("continue")
    first_max = fresh.number("scores.max()")
    fresh.reset()
    fresh.set_breakpoints(GPT, [{"line": MASK, "condition": f"scores.max() > {first_max}"}])
    stop = fresh.motion("continue")
    assert stop["reason"] == "breakpoint" and fresh.position() == 43
    assert fresh.number("scores.max()") > first_max


def test_hit_count_breakpoint_stops_on_the_nth_hit(fresh):
    fresh.set_breakpoints(GPT, [{"line": MASK, "hitCondition": "2"}])
    assert fresh.motion("continue")["reason"] == "breakpoint" and fresh.position() == 43
    assert fresh.motion("continue")["reason"] == "end"
    (bad,) = fresh.set_breakpoints(GPT, [{"line": MASK, "hitCondition": "every other"}])
    assert not bad["verified"] and "hit condition" in bad["message"]


def test_log_point_prints_and_does_not_stop(fresh):
    fresh.set_breakpoints(GPT, [{"line": MASK, "logMessage": "scores max {scores.max()} in {scores.shape[1]} heads"}])
    mark = fresh.client.mark()
    assert fresh.motion("continue")["reason"] == "end"
    printed = [b["output"] for n, b in fresh.client.events_since(mark) if n == "output"]
    assert len(printed) == 2 and all(p.startswith("scores max ") and p.endswith(" in 4 heads\n") for p in printed)


def test_bad_condition_is_unverified_and_does_not_fail_the_batch(fresh):
    bad, good = fresh.set_breakpoints(GPT, [{"line": MASK, "condition": "__import__('os')"}, {"line": MASK + 1}])
    assert not bad["verified"] and "not allowed" in bad["message"]
    assert good["verified"]


def test_function_breakpoints_on_an_op_a_module_path_and_a_node(fresh):
    specs = [{"name": "aten.softmax"}, {"name": "blocks.1.mlp"}, {"name": "gelu"}, {"name": "no.such.module"}]
    bps = fresh.request("setFunctionBreakpoints", {"breakpoints": specs})["breakpoints"]
    assert [b["verified"] for b in bps] == [True, True, True, False]
    assert "no node, op or module path" in bps[3]["message"]
    names = []
    while (stop := fresh.motion("continue"))["reason"] != "end":
        assert stop["reason"] == "function breakpoint"
        names.append(fresh.top()["name"].split(" ")[0])
    assert names == ["softmax", "gelu", "softmax_1", "linear_6"]  # linear_6 enters blocks.1.mlp; node gelu only


def test_data_breakpoint_on_tensor_write(fresh):
    info = fresh.request("dataBreakpointInfo", {"name": "softmax_1"})
    assert info["dataId"] == "softmax_1" and info["accessTypes"] == ["write"]
    (bp,) = fresh.request("setDataBreakpoints", {"breakpoints": [{"dataId": info["dataId"]}]})["breakpoints"]
    stop = fresh.motion("continue")
    assert stop["reason"] == "data breakpoint" and stop["hitBreakpointIds"] == [bp["id"]]
    written_at = fresh.position()
    last = fresh.request("timeline", {"start": written_at - 1, "count": 1})["ticks"][0]
    assert last["node"] == "softmax_1"  # stopped right after the write, as a watchpoint does
    assert fresh.evaluate("softmax_1")["result"].startswith("float32[1, 4, 16, 16] cpu min=")  # it exists now
    assert fresh.motion("continue")["reason"] == "end"
    assert fresh.motion("reverseContinue")["reason"] == "data breakpoint" and fresh.position() == written_at


def test_data_breakpoint_info_through_a_scope_variable(fresh):
    fresh.set_breakpoints(GPT, [{"line": MASK}])
    fresh.motion("continue")
    scopes = fresh.request("scopes", {"frameId": 1})["scopes"]
    local_ref = next(s["variablesReference"] for s in scopes if s["name"] == "Locals")
    info = fresh.request("dataBreakpointInfo", {"variablesReference": local_ref, "name": "scores"})
    assert info["dataId"] == "div"
    missing = fresh.request("dataBreakpointInfo", {"variablesReference": local_ref, "name": "nothing"})
    assert missing["dataId"] is None and "can be watched" in missing["description"]
    bps = fresh.request("setDataBreakpoints", {"breakpoints": [{"dataId": "div", "accessType": "read"},
                                                               {"dataId": "nope"}]})["breakpoints"]
    assert [b["verified"] for b in bps] == [False, False]


@pytest.fixture(scope="module")
def planted(schema):
    debugger = Debugger.spawn(schema)
    debugger.start(PLANTED, stopOnEntry=True)
    yield debugger
    debugger.close()


def test_nan_filter_stops_at_first_nan_line(planted):
    sqrt_line = line_of("torch.sqrt(shifted)", PLANTED.read_text().splitlines())
    planted.reset(PLANTED)
    stop = planted.motion("continue")
    assert stop["reason"] == "exception" and stop["text"] == "NaN"
    info = planted.request("exceptionInfo", {"threadId": 1})
    details = info["details"]
    assert info["exceptionId"] == "nan" and info["breakMode"] == "always"
    assert details["source"].endswith(f"planted_nan.py:{sqrt_line}")
    assert details["count"] == 16 and details["firstIndex"] == [0, 0] and details["fullTypeName"] == "aten.sqrt.default"
    (inputs,) = details["inputs"].values()
    assert inputs["max"] < 0 and inputs["nan"] == 0  # the input was finite: this line made the NaN
    assert planted.motion("continue")["reason"] == "end"  # later NaNs are carried, not new


def test_without_the_nan_filter_the_run_reaches_the_end(planted):
    planted.reset(PLANTED)
    answer = planted.request("setExceptionBreakpoints", {"filters": ["inf", "bogus"]})["breakpoints"]
    assert [b["verified"] for b in answer] == [True, False]
    assert planted.motion("continue")["reason"] == "end"


def test_breakpoint_locations_are_the_lines_where_nodes_run(fresh):
    first = line_of("def forward(self, x):")
    lines = fresh.request("breakpointLocations", {"source": {"path": str(GPT)}, "line": first,
                                                  "endLine": first + 12})["breakpoints"]
    assert [b["line"] for b in lines] == list(range(first + 2, first + 12))
