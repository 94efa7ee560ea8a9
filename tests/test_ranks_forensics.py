"""Forensics per rank (docs/ranks.md, "Forensics per rank"): each rank's pass against a float64 reference of the
same ranks, whose collectives run for real with every rank's reference at once. A float16 sum planted on rank 1
only is named with its rank and line, and rank 0's error, whose own nodes are exact, is attributed to the all_reduce
that carried it. Real rank processes in one gloo group: one coordinator for the Python level, one DAP server for the
wire."""

from __future__ import annotations

import os

import pytest

from dap_server.client import DapError
from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from tests.conftest import MODELS, line_of
from tests.dap.wire import Debugger, SchemaCheck

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
MODEL = MODELS / "ranks" / "precision_on_one_rank.py"
BUG, CARRIES = (line_of(MODEL, marker) for marker in ("# BUG", "# CARRIES"))
NOT_YET = "run every rank to the end of its program first (rank 0 has run 0 of its 1 collective(s))"


@pytest.fixture(scope="module")
def ranks(launcher):
    with Coordinator(str(MODEL), 2, timeout_s=120, launcher=launcher) as c:
        yield c


def _line(finding: dict) -> tuple[str, int]:
    return os.path.basename(finding["source"]["file"]), finding["source"]["line"]


def test_the_rank_and_line_that_introduced_an_error_are_named_and_the_collective_that_carried_it(ranks):
    with pytest.raises(RewindError, match=NOT_YET.replace("(", r"\(").replace(")", r"\)")):
        ranks.forensics()  # the reference passes need every collective run with the peers first
    assert ranks.run().reason == "end"
    found = ranks.forensics()
    root = found["divergence"]
    assert (root["rank"], _line(root), root["op"]) == (1, (MODEL.name, BUG), "aten.sum.dim_IntList")
    assert root["carriedBy"] is None and root["pattern"]["pattern"] == "low-precision-accumulation"
    on_rank0 = found["ranks"][0]["divergence"]
    assert (on_rank0["rank"], on_rank0["node"], _line(on_rank0)) == (0, "all_reduce", (MODEL.name, CARRIES))
    carried = on_rank0["carriedBy"]
    assert (carried["collective"], carried["number"], carried["from"]) == ("all_reduce", 1, [1])
    assert [i["within"] for i in carried["inputs"]] == [True, False]  # rank 0's own input to it is exact
    assert on_rank0["introduced"] is None and "every rank's input" in on_rank0["introducedReason"]
    # The reference's all_reduce summed both ranks' float64 values: rank 0's error there is rank 1's, all of it.
    assert on_rank0["observed"]["maxAbs"] == pytest.approx(root["observed"]["maxAbs"], rel=1e-3)
    assert found["headline"] == (f"rank 1 introduces the error at {MODEL.name}:{BUG} (`sum_1`); all_reduce #1 at "
                                 f"{MODEL.name}:{CARRIES} carried it to rank 0")
    assert ranks.forensics() == found  # the reference passes are kept: asked again, the same answer


def test_a_start_past_a_finding_or_of_the_wrong_kind_is_answered_in_words(ranks):
    ranks.run()
    later = ranks.forensics(start=2)  # past rank 1's sum (tick 1) and rank 0's all_reduce (tick 1)
    # Rank 1's all_reduce (tick 3) is beyond tolerance too, but its own input brought the error: inherited.
    assert [r["divergence"] for r in later["ranks"]] == [None, None] and later["divergence"] is None
    assert "from tick 2 on" in later["ranks"][1]["divergenceReason"] and later["headlineReason"] == "no divergence"
    for bad in (-1, "3", True, 1.5):
        with pytest.raises(RewindError, match="start is a tick to look from, a whole number from 0"):
            ranks.forensics(start=bad)


def test_first_divergence_through_the_wire_answers_per_rank():
    schema = SchemaCheck()
    debugger = Debugger.spawn(schema)
    try:
        assert debugger.start(MODEL, stopOnEntry=True, ranks=2)["reason"] == "entry"
        with pytest.raises(DapError, match="run every rank to the end of its program first"):
            debugger.request("firstDivergence", {})
        assert debugger.motion("continue")["reason"] == "end"
        body = debugger.request("firstDivergence", {})
        root = body["divergence"]
        assert (body["reference"], root["rank"], root["source"]["line"]) == ("torch:cpu:float64", 1, BUG)
        assert root["origin"] is None and "not traced with ranks" in root["originReason"]
        on_rank0 = body["ranks"][0]["divergence"]
        assert (on_rank0["rank"], on_rank0["source"]["line"], on_rank0["carriedBy"]["from"]) == (0, CARRIES, [1])
        assert debugger.request("firstDivergence", {"origin": False})["divergence"]["originReason"] == \
            "not asked for (origin: false)"
        for bad, words in (({"start": -1}, "start"), ({"start": "x"}, "start"), ({"origin": "yes"}, "origin")):
            with pytest.raises(DapError, match=words) as caught:
                debugger.request("firstDivergence", bad)
            assert "Error" not in caught.value.message
        with pytest.raises(DapError) as caught:  # forensics answers for every rank: there is no rank to choose
            debugger.request("firstDivergence", {"rank": 1})
        assert caught.value.message == "firstDivergence: unknown field 'rank' (known: start, origin)"
        with pytest.raises(DapError, match="'ablatePrecision' is not supported with ranks yet"):
            debugger.request("ablatePrecision", {"search": True})  # it would re-run nodes on one rank
    finally:
        debugger.close()
    assert schema.failures == [], "messages that break the DAP schema"
