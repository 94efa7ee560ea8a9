"""Forensics names the root cause, not the symptom (issue 16): the origin upstream of an inherited divergence with
its amplifiers, swamping, intended infinities absorbed before any output, one diagnosis per node, the right fix
first, tolerances from what the program is compiled for, and JSON that says what its numbers are."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from hardware.errors import RewindError
from provenance import forensics_cli
from provenance.births import births
from provenance.problems import collect
from tests.conftest import line_of, open_session
from tests.forensics_cases import FORENSICS

POSITIONS = FORENSICS / "half_positions.py"
SWAMPING = FORENSICS / "swamping.py"
ABSORBED = FORENSICS / "absorbed_log.py"
REDUCTION = FORENSICS / "half_reduction.py"


def forensics(path, *args: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = forensics_cli.main([str(path), "--driver", "torch:cpu", "--budget-mb", "64", "--json", *args])
    return status, json.loads(out.getvalue())


@pytest.fixture(scope="module")
def positions() -> tuple[int, dict]:
    return forensics(POSITIONS, "--no-ablate")


@pytest.fixture(scope="module")
def swamping() -> tuple[int, dict]:
    return forensics(SWAMPING, "--no-ablate")


def test_float16_positions_are_the_root_cause_and_cos_the_amplifier(positions):
    status, report = positions
    assert status == 1 and report["problem"]
    bug, amplified = line_of(POSITIONS, "# BUG"), line_of(POSITIONS, "# AMPLIFIED")
    assert report["headline"].startswith(f"error introduced at half_positions.py:{bug} by `arange`")
    assert re.search(rf"amplified \d+x by `cos` at half_positions.py:{amplified}", report["headline"])
    divergence = report["divergence"]
    assert divergence["node"] == "cos" and divergence["introduced"]["within"]  # the first beyond tolerance, inherited
    origin = divergence["origin"]
    assert (origin["node"], origin["pattern"]["pattern"], origin["confirmed"]) == ("arange", "inexact-integers", True)
    assert origin["introduced"]["within"] and origin["sensitivity"] > 1  # within its own tolerance, not cos's
    trials = origin["confirmation"]
    assert trials["withOrigin"]["fixed"] and not trials["withoutOrigin"]["fixed"]
    assert "arange" in trials["withOrigin"]["nodes"] and "arange" not in trials["withoutOrigin"]["nodes"]
    (cos,) = divergence["amplifiedBy"]
    assert cos["node"] == "cos" and cos["source"].endswith(f":{amplified}") and cos["factor"] > 100


def test_a_small_value_swamped_in_bfloat16_is_found_at_the_add(swamping):
    status, report = swamping
    bug = line_of(SWAMPING, "# BUG")
    assert status == 1 and report["headline"].startswith(f"error introduced at swamping.py:{bug} by `add` (a small "
                                                         "operand lost against a large one)")
    origin = report["divergence"]["origin"]
    assert (report["divergence"]["node"], origin["node"], origin["pattern"]["pattern"]) == ("sub", "add", "swamping")
    assert "below half the spacing of bfloat16" in origin["pattern"]["reason"]
    assert [a["node"] for a in report["divergence"]["amplifiedBy"]] == ["sub"]


def test_reasons_and_headlines_say_huge_and_infinite_ratios_in_words(swamping, positions):
    text = json.dumps([swamping[1], positions[1]])
    assert not re.search(r"infx|inf x|\de\+\d+x", text)
    assert "cancel to nothing" in swamping[1]["divergence"]["pattern"]["reason"]


def test_an_editor_gets_the_root_cause_line_and_the_first_divergence_line():
    origin, divergence = collect(open_session(SWAMPING))
    assert (origin.node, divergence.node) == ("add", "sub")
    assert origin.frames[-1].loc.line == line_of(SWAMPING, "# BUG") and origin.severity == "error"
    assert origin.message.startswith("root cause of the divergence at aten.sub.Tensor 'sub'")
    assert "root cause upstream: error introduced at swamping.py" in divergence.message


def test_an_infinity_written_on_purpose_and_absorbed_leaves_a_correct_model_clean():
    status, report = forensics(ABSORBED)
    assert status == 0 and not report["problem"] and report["headline"].startswith("clean")
    assert report["nonfinite"] is None and "written on purpose" in report["nonfiniteReason"]
    (born,) = report["absorbed"]
    assert (born["node"], born["kind"], born["reachesOutput"], born["referenceHasIt"]) == ("log", "inf", False, True)
    assert born["source"].endswith(f":{line_of(ABSORBED, '# ABSORBED')}")
    assert [a["op"] for a in born["absorbedAt"]] == ["aten._to_copy.default"]


def test_births_say_which_reach_an_output_and_where_the_others_are_absorbed():
    session = open_session(ABSORBED, entry="leaky")
    absorbed, reaching = births(session.tl, session.program)
    assert (absorbed.node.name, absorbed.reaches_output, [n.op for n in absorbed.absorbed_at]) == \
        ("log", False, ["aten._to_copy.default"])
    assert (reaching.node.name, reaching.reaches_output, reaching.absorbed_at) == ("log_1", True, [])
    assert reaching.to_dict()["source"].endswith(f":{line_of(ABSORBED, '# REACHES')}")
    found = session.forensics.first_nonfinite()
    assert found.node.name == "log_1"  # the absorbed birth before it is not the headline


def test_the_nonfinite_output_filter_stops_only_at_births_that_reach_an_output():
    session = open_session(ABSORBED, entry="leaky")
    session.set_exception_filters({"inf"})
    assert session.start().exception.source.endswith(f":{line_of(ABSORBED, '# ABSORBED')}")  # every birth
    session.goto(0)
    session.set_exception_filters({"nonfinite-output"})
    stop = session.run()
    assert stop.reason == "exception" and stop.exception.filter == "inf" and stop.exception.node == "log_1"
    assert stop.exception.source.endswith(f":{line_of(ABSORBED, '# REACHES')}")
    assert session.run().reason == "end"
    with pytest.raises(RewindError, match="unknown exception filter.*nonfinite-outputs.*nonfinite-output"):
        session.set_exception_filters({"nonfinite-outputs"})


def test_an_absorbed_intended_infinity_is_information_for_an_editor():
    (note,) = collect(open_session(ABSORBED))
    assert (note.severity, note.kind, note.node) == ("information", "inf", "log")
    assert "removed by _to_copy '_to_copy_1'" in note.message and note.message.endswith("not a problem")


def test_one_diagnosis_per_node_a_float16_overflow_is_overflow_in_both_sections():
    status, report = forensics(FORENSICS / "half_overflow.py", "--no-ablate")
    assert status == 1 and report["nonfinite"]["node"] == report["divergence"]["node"] == "sum_1"
    assert report["nonfinite"]["pattern"]["pattern"] == report["divergence"]["pattern"]["pattern"] == "overflow"


def test_log_of_a_softmax_advises_log_softmax_first_and_its_json_says_what_is_undefined():
    status, report = forensics(FORENSICS / "log_of_softmax.py", "--no-ablate")
    assert status == 1 and report["nonfinite"]["pattern"]["fix"].startswith("compute log(softmax(x)) as "
                                                                             "torch.log_softmax")
    (out,) = report["outputs"]
    assert out["nonfinite"] > 0 and out["referenceNonfinite"] == 0 and not out["within"]
    assert out["cosine"] is None and "undefined" in out["cosineReason"]


def test_a_fixed_copy_is_judged_at_the_precision_the_model_is_compiled_for():
    status, report = forensics(REDUCTION, "--no-ablate")
    assert status == 1 and report["divergence"]["node"] == "sum_1"  # float16 reduction
    status, report = forensics(REDUCTION, "--entry", "fixed", "--no-ablate")
    assert status == 0 and not report["problem"], report["headline"]  # float32 reduction of a float16 model
    assert [o["rtol"] for o in report["outputs"]] == [5e-3]
