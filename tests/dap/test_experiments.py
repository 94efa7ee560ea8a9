"""Experiments and the repair loop through the wire: addPatch, listPatches, measureBranch, compareBranches,
restoreBranch (the undo, bit for bit), removePatch; repair and suggestFixes with their evidence."""

import base64

import pytest

from dap_server.client import DapError
from tests.conftest import MODELS
from tests.dap.wire import Debugger
from tests.forensics_cases import FORENSICS

SOFTMAX = FORENSICS / "softmax_overflow.py"
FIXES = MODELS / "fixes"
STABLE_EXP = (FIXES / "stable_softmax.py").read_text()


@pytest.fixture(scope="module")
def knowledge(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("knowledge") / "fixes.json")


def load(debugger: Debugger, path) -> dict:
    """Load `path` afresh and run it to the end."""
    debugger.request("setExceptionBreakpoints", {"filters": []})
    return debugger.motion("restart", {"arguments": {"program": str(path), "driver": "torch:cpu"}})


def memory(debugger: Debugger, values: list[str]) -> dict[str, bytes]:
    """The bytes every value holds at the current position, read with readMemory."""
    out = {}
    for name in values:
        body = debugger.request("readMemory", {"memoryReference": f"rewind-value:{name}", "count": 1 << 16})
        out[name] = base64.b64decode(body["data"])
    return out


def test_patches_are_measured_compared_and_undone_bit_for_bit_through_the_wire(debugger):
    assert load(debugger, SOFTMAX)["reason"] == "end"
    written = ["linear", "linear_1", "matmul", "exp", "sum_1", "div", "matmul_1"]
    before = memory(debugger, written)
    mark = debugger.client.mark()
    listing = debugger.request("addPatch", {"name": "stable-exp", "branch": "stable", "node": "exp",
                                            "function": STABLE_EXP, "entry": "stable_exp"})
    assert listing["active"] == "stable" and listing["branches"][0]["patches"][0]["kind"] == "function"
    assert ("invalidated", {"areas": ["variables", "stacks"]}) in debugger.client.events_since(mark)
    assert debugger.number("div.isnan().sum()") == 0  # the branch is what the session shows now
    debugger.request("addPatch", {"name": "wide", "branch": "wide", "node": "exp", "precision": "float32"})
    branches = debugger.request("listPatches")["branches"]
    assert [(b["name"], [p["name"] for p in b["patches"]]) for b in branches] == [("stable", ["stable-exp"]),
                                                                                  ("wide", ["wide"])]
    measured = debugger.request("measureBranch", {"branch": "stable"})
    assert measured["outputs"][0]["reference"]["within"] and not measured["outputs"][0]["originalReference"]["within"]
    assert [r["node"] for r in measured["nodes"]] == ["exp", "sum_1", "div", "matmul_1"]
    compared = debugger.request("compareBranches", {"branches": ["stable", "wide"]})
    sides = compared["outputs"][0]["branches"]
    assert sides["stable"]["reference"]["within"] and not sides["wide"]["reference"]["within"]
    assert debugger.request("restoreBranch")["active"] == "original"
    assert memory(debugger, written) == before
    assert debugger.motion("stepBack")["reason"] == "step" and debugger.number("div.isnan().sum()") > 0
    debugger.request("removePatch", {"branch": "wide", "name": "wide"})
    assert [b["name"] for b in debugger.request("listPatches")["branches"]] == ["stable"]


def test_bad_patch_requests_get_errors_naming_the_problem(debugger):
    load(debugger, SOFTMAX)
    with pytest.raises(DapError, match="exactly one of precision, function, attributes or edit"):
        debugger.request("addPatch", {"name": "p", "node": "exp", "precision": "float32", "attributes": {"x": 1}})
    with pytest.raises(DapError, match="unknown field 'dtype'"):
        debugger.request("addPatch", {"name": "p", "node": "exp", "dtype": "float32"})
    with pytest.raises(DapError, match="no branch 'nope'"):
        debugger.request("measureBranch", {"branch": "nope"})
    with pytest.raises(DapError, match="name a branch to measure"):
        debugger.request("measureBranch", {})
    with pytest.raises(DapError, match="'input' of the pass|is an input of the pass"):
        debugger.request("addPatch", {"name": "p", "edit": {"value": "x", "index": [0, 0, 0], "set": 1.0}})
    assert debugger.request("threads")["threads"]  # the server keeps serving


def test_repair_validates_the_knowledge_bases_suggestion_with_progress(debugger, knowledge):
    load(debugger, SOFTMAX)
    mark = debugger.client.mark()
    report = debugger.request("repair", {"knowledge": knowledge, "shapes": 0})
    assert report["verdict"] == "validated" and report["fix"]["origin"] == "built-in"
    assert report["knowledge"]["recorded"]["pattern"] == "exp-overflow"
    (diff,) = report["sourceDiffs"]  # the fix in the model's source (tests/test_source_edits.py)
    assert "+        weights = exp_minus_row_max(scores)  # BUG: no max subtraction" in diff["diff"].splitlines()
    events = [name for name, _ in debugger.client.events_since(mark) if name.startswith("progress")]
    assert events[0] == "progressStart" and events[-1] == "progressEnd"
    suggested = debugger.request("suggestFixes", {"knowledge": knowledge, "limit": 2})["suggestions"]
    assert suggested[0]["origin"] == "learned" and suggested[0]["finding"] == "exp"


def test_repair_rejects_a_wrong_fix_with_evidence_and_refuses_a_copy_of_the_reference(debugger, knowledge):
    load(debugger, FORENSICS / "rsqrt_no_epsilon.py")
    wrong = {"text": (FIXES / "large_epsilon.py").read_text(), "name": "large_epsilon.py"}
    report = debugger.request("repair", {"fixes": [wrong], "knowledge": knowledge, "seeds": 1, "scales": [],
                                         "shapes": 0})
    (attempt,) = report["attempts"]
    assert report["verdict"] == "rejected" and attempt["candidate"]["name"] == "large_epsilon.py"
    assert [c["inputs"]["name"] for c in attempt["validation"]["checks"]] == ["example", "seed 1"]
    assert all(c["outputs"][0]["mismatches"] > 0 for c in attempt["validation"]["checks"])
    load(debugger, SOFTMAX)
    cheat = {"text": (FIXES / "copies_reference.py").read_text(), "name": "copies_reference.py"}
    report = debugger.request("repair", {"fixes": [cheat], "knowledge": knowledge})
    (attempt,) = report["attempts"]
    assert report["verdict"] == "rejected" and attempt["reason"] == "the integrity check refused the fix"
    assert attempt["integrity"]["violations"][0]["what"] == "imports gc"
    with pytest.raises(DapError, match="maxAttempts"):
        debugger.request("repair", {"maxAttempts": 0})
