"""Numerical forensics through the wire: NaN/Inf and divergence stops with their evidence, and the
compareWithReference, firstDivergence and ablatePrecision requests with their progress events."""

import pytest

from dap_server.client import DapError
from tests.conftest import line_of
from tests.dap.wire import Debugger
from tests.forensics_cases import FORENSICS, PLANTED, ids

NONFINITE = [c for c in PLANTED if c.nonfinite]
DIVERGING = [c for c in PLANTED if c.divergence]
FIXABLE = [c for c in PLANTED if c.precision_fixes]
SOFTMAX = FORENSICS / "softmax_overflow.py"


def load(debugger: Debugger, path, filters: list[str], **launch) -> dict:
    """Load `path` afresh with these exception filters and run to the first stop."""
    debugger.request("setExceptionBreakpoints", {"filters": filters})
    return debugger.motion("restart", {"arguments": {"program": str(path), "driver": "torch:cpu", **launch}})


def progress_of(debugger: Debugger, mark) -> list[str]:
    return [name for name, _ in debugger.client.events_since(mark) if name.startswith("progress")]


@pytest.mark.parametrize("case", NONFINITE, ids=ids(NONFINITE))
def test_nan_or_inf_stop_names_the_line_node_and_pattern_in_exception_info(debugger, case):
    kind, node, pattern, marker = case.nonfinite
    stop = load(debugger, case.path, [kind])
    assert stop["reason"] == "exception" and stop["text"] == {"nan": "NaN", "inf": "Inf"}[kind]
    details = debugger.request("exceptionInfo", {"threadId": 1})["details"]
    assert details["node"] == node and details["source"].endswith(f"{case.path.name}:{case.line(marker)}")
    assert details["count"] > 0 and details["inputs"]
    assert details["evidence"]["pattern"]["pattern"] == pattern


@pytest.mark.parametrize("case", DIVERGING, ids=ids(DIVERGING))
def test_divergence_filter_stops_where_the_error_was_introduced(debugger, case):
    node, pattern, marker = case.divergence
    stop = load(debugger, case.path, ["divergence"])
    assert stop["reason"] == "exception" and stop["text"] == "Divergence"
    info = debugger.request("exceptionInfo", {"threadId": 1})
    details = info["details"]
    assert info["exceptionId"] == "divergence" and "diverges from the reference" in info["description"]
    assert details["node"] == node and details["source"].endswith(f"{case.path.name}:{case.line(marker)}")
    assert details["evidence"]["pattern"]["pattern"] == pattern
    assert details["evidence"]["observed"]["within"] is False


@pytest.mark.parametrize("case", FIXABLE, ids=ids(FIXABLE))
def test_ablate_precision_search_finds_a_fix_and_reports_progress(debugger, case):
    load(debugger, case.path, [])
    mark = debugger.client.mark()
    search = debugger.request("ablatePrecision", {"search": True})["search"]
    assert search["found"]["fixed"] and all(o["within"] for o in search["found"]["after"])
    assert not all(o["within"] for o in search["before"])
    events = progress_of(debugger, mark)
    assert events[0] == "progressStart" and events[-1] == "progressEnd"


def test_compare_with_reference_returns_the_per_node_table(debugger):
    load(debugger, FORENSICS / "cancellation.py", [])
    mark = debugger.client.mark()
    answer = debugger.request("compareWithReference", {"introduced": True})
    assert answer["reference"] == "torch:cpu:float64"
    rows = {r["node"]: r for r in answer["rows"]}
    assert set(rows) == {"cos", "rsub", "mul", "div", "linear"}
    assert not rows["rsub"]["within"] and not rows["rsub"]["introduced"]["within"]
    assert not rows["div"]["within"] and rows["div"]["introduced"]["within"]  # inherited, not introduced
    assert {"maxAbs", "maxRel", "rmse", "cosine", "mismatches", "firstMismatch"} <= set(rows["rsub"])
    assert not answer["outputs"][0]["within"]
    assert "progressStart" in progress_of(debugger, mark)


def test_first_divergence_request_gives_node_line_pattern_and_growth(debugger):
    case = next(c for c in PLANTED if c.model == "cancellation")
    load(debugger, case.path, [])
    found = debugger.request("firstDivergence", {})["divergence"]
    assert (found["node"], found["source"]["line"]) == ("rsub", case.line("# BUG"))
    assert found["pattern"]["pattern"] == "catastrophic-cancellation"
    assert found["growth"][0]["node"] == "rsub" and found["growth"][-1]["node"] == "linear"


def test_first_divergence_traces_an_inherited_error_to_its_origin_upstream(debugger):
    """The cos of float16 positions diverges first, but the arange two lines up introduced the error."""
    path = FORENSICS / "half_positions.py"
    load(debugger, path, [])
    found = debugger.request("firstDivergence", {})["divergence"]
    assert found["node"] == "cos" and found["introduced"]["within"]
    origin = found["origin"]
    assert origin["node"] == "arange" and origin["confirmed"] and origin["source"].endswith(f":{line_of(path, '# BUG')}")
    assert origin["pattern"]["pattern"] == "inexact-integers"
    assert [a["node"] for a in found["amplifiedBy"]][0] == "cos" and found["headline"].startswith("error introduced at")
    quick = debugger.request("firstDivergence", {"origin": False})["divergence"]
    assert quick["origin"] is None and quick["originReason"]


def test_ablate_precision_on_named_nodes_or_a_span_then_restores(debugger):
    load(debugger, SOFTMAX, [])
    before = debugger.request("timeline", {"count": 0})["position"]
    named = debugger.request("ablatePrecision", {"nodes": ["exp", "sum_1", "div"]})["ablation"]
    assert named["fixed"] and [n["dtype"] for n in named["nodes"]] == ["float32"] * 3
    span = debugger.request("ablatePrecision", {"span": ["exp", "div"], "dtype": "float64"})["ablation"]
    assert span["fixed"] and [n["node"] for n in span["nodes"]] == ["exp", "sum_1", "div"]
    assert not debugger.request("ablatePrecision", {"nodes": ["exp"]})["ablation"]["fixed"]
    assert debugger.request("timeline", {"count": 0})["position"] == before
    assert debugger.number("div.isnan().sum()") > 0  # the original pass is back


def test_bad_forensics_arguments_get_errors_naming_the_problem(debugger):
    load(debugger, SOFTMAX, [])
    with pytest.raises(DapError, match="no node, op or module path 'nope'"):
        debugger.request("ablatePrecision", {"nodes": ["nope"]})
    with pytest.raises(DapError, match="exactly one of nodes, span or search"):
        debugger.request("ablatePrecision", {"nodes": ["exp"], "search": True})
    with pytest.raises(DapError, match="runs before its first"):
        debugger.request("ablatePrecision", {"span": ["div", "exp"]})
    load(debugger, SOFTMAX, [], reference="no such reference")
    with pytest.raises(DapError, match="neither a driver"):
        debugger.request("firstDivergence", {})
    assert debugger.request("threads")["threads"]  # the server keeps serving


def test_clean_model_runs_to_the_end_under_nan_and_divergence_filters(debugger):
    stop = load(debugger, FORENSICS / "mixed_precision.py", ["nan", "divergence"])
    assert stop["reason"] == "end"
    assert debugger.request("firstDivergence", {})["divergence"] is None


def test_the_nonfinite_output_filter_skips_an_absorbed_infinity_through_the_wire(debugger):
    """T5-like: a log(0) = -inf discarded before the outputs stops `inf`, not `nonfinite-output`."""
    path = FORENSICS / "absorbed_log.py"
    assert load(debugger, path, ["inf"])["reason"] == "exception"
    assert load(debugger, path, ["nonfinite-output"])["reason"] == "end"
    stop = load(debugger, path, ["nonfinite-output"], entry="leaky")
    assert stop["reason"] == "exception"
    info = debugger.request("exceptionInfo", {"threadId": 1})
    assert info["exceptionId"] == "inf" and info["details"]["source"].endswith(f":{line_of(path, '# REACHES')}")
