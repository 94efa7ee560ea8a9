"""The reference per rank through the wire (docs/ranks.md, "Forensics per rank"): compareWithReference,
referenceValue and readReference asked of one rank (its thread or frame) are answered by that rank's engine from its
float64 reference pass, which every rank runs at once, each collective for real with its peers'. On the planted
float16 sum of rank 1 (tests/models/ranks/precision_on_one_rank.py): 2 real rank processes in one gloo group, one
launch for the module."""

from __future__ import annotations

import base64

import pytest
import torch

from dap_server.client import DapError
from dap_server.frames import FRAMES_PER_THREAD
from tests.conftest import MODELS, fresh_module, line_of
from tests.dap.wire import Debugger, refused

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
MODEL = MODELS / "ranks" / "precision_on_one_rank.py"
BUG, CARRIES = (line_of(MODEL, marker) for marker in ("# BUG", "# CARRIES"))
REQUESTS = {"compareWithReference": {"threadId": 2}, "referenceValue": {"name": "sums", "frameId": 1},
            "readReference": {"name": "total", "frameId": FRAMES_PER_THREAD + 1, "count": 8}}


@pytest.fixture(scope="module")
def ranks(schema):
    """The ranks run to their end; `refusals` holds what each request was answered on entry, before any rank had run
    its collective."""
    debugger = Debugger.spawn(schema)
    assert debugger.start(MODEL, stopOnEntry=True, ranks=2)["reason"] == "entry"
    debugger.refusals = {}
    for command, arguments in REQUESTS.items():
        with pytest.raises(DapError) as caught:
            debugger.request(command, arguments)
        debugger.refusals[command] = caught.value.message
    assert debugger.motion("continue")["reason"] == "end"
    yield debugger
    debugger.close()


def _frame(thread: int) -> int:
    return (thread - 1) * FRAMES_PER_THREAD + 1


def _float64(body: dict) -> list[float]:
    return torch.frombuffer(bytearray(base64.b64decode(body["data"])), dtype=torch.float64).tolist()


def test_before_every_rank_has_run_its_collectives_the_reference_is_refused_in_words(ranks):
    for command in REQUESTS:  # the reference passes run every collective together: each rank must have run its own
        assert ranks.refusals[command].endswith("run every rank to the end of its program first (rank 0 has run 0 "
                                                "of its 1 collective(s))")
        assert "Error" not in ranks.refusals[command]


def test_compare_with_reference_names_the_float16_sum_on_rank_1_and_the_all_reduce_on_rank_0(ranks):
    first = {}
    for thread in (1, 2):
        body = ranks.request("compareWithReference", {"threadId": thread})
        assert (body["rank"], body["reference"]) == (thread - 1, "torch:cpu:float64")
        first[thread - 1] = next(row for row in body["rows"] if not row["within"])
        assert not any(output["within"] for output in body["outputs"])  # rank 1's error reaches every rank's output
    assert (first[1]["node"], first[1]["op"]) == ("sum_1", "aten.sum.dim_IntList")
    assert first[1]["source"].endswith(f"{MODEL.name}:{BUG}")
    assert (first[0]["node"], first[0]["tick"]) == ("all_reduce", 1)  # rank 0's own sum, at tick 0, is exact
    assert first[0]["source"].endswith(f"{MODEL.name}:{CARRIES}")


def test_with_introduced_the_sum_introduced_its_error_and_the_all_reduce_carried_it_in(ranks):
    rows = {r: {row["node"]: row for row in ranks.request("compareWithReference", {"threadId": r + 1,
                                                                                    "introduced": True})["rows"]}
            for r in (0, 1)}
    assert rows[1]["sum_1"]["verdict"] == "introduced" and not rows[1]["sum_1"]["introduced"]["within"]
    assert rows[0]["sum_1"]["verdict"] == "within"
    reduce = rows[0]["all_reduce"]  # rerun on rank 0's reference inputs alone, it would measure nothing of its own
    assert (reduce["verdict"], reduce["introduced"]) == ("inherited", None)
    assert "made of every rank's input" in reduce["introducedReason"]
    assert (reduce["carriedBy"]["from"], [i["within"] for i in reduce["carriedBy"]["inputs"]]) == ([1], [True, False])
    assert rows[1]["all_reduce"]["verdict"] == "inherited"  # its input on rank 1 is the one beyond tolerance


def test_the_reference_of_a_value_on_each_rank_is_the_float64_computation(ranks):
    model = fresh_module(MODEL)
    inputs = [model.build(rank, 2)[1][0].double() for rank in (0, 1)]
    sums = [x.sum(-1) for x in inputs]  # the float16 sum's reference is float64 too: a cast down is made a no-op
    for rank in (0, 1):
        value = ranks.request("referenceValue", {"name": "sums", "frameId": _frame(rank + 1)})
        assert (value["rank"], value["referenceValue"]["dtype"]) == (rank, "float64")
        stats = value["referenceValue"]["stats"]
        assert (stats["min"], stats["max"], stats["mean"]) == (sums[rank].min().item(), sums[rank].max().item(),
                                                               sums[rank].mean().item())
        assert value["comparison"]["within"] is (rank == 0)  # rank 1's float16 sum lost its small parts
        total = ranks.request("readReference", {"name": "total", "frameId": _frame(rank + 1), "count": 32})
        assert (total["rank"], total["value"], total["dtype"]) == (rank, "wait_tensor", "float64")
        assert _float64(total) == (sums[0] + sums[1]).tolist()  # the all_reduce ran in float64 with the peer's
        bytes_ = ranks.request("readReference", {"name": "sums", "frameId": _frame(rank + 1), "count": 32})
        assert _float64(bytes_) == sums[rank].tolist()


@pytest.mark.parametrize("command, arguments, words", [
    ("referenceValue", {"name": "nope", "frameId": FRAMES_PER_THREAD + 1},
     "rank 1: 'nope' is not a variable or value of the program"),
    ("readReference", {"name": "sums", "frameId": 2 * FRAMES_PER_THREAD + 1}, f"no frame {2 * FRAMES_PER_THREAD + 1}"),
    ("readReference", {"name": "sums", "count": -1}, "count"),
    ("compareWithReference", {"threadId": 3}, "no thread 3: this program's threads are 1..2"),
    ("compareWithReference", {"threadId": 0}, "no thread 0"),
    ("compareWithReference", {"threadId": "2"}, "threadId"),
    ("compareWithReference", {"rank": 1}, "unknown field 'rank'"),
    ("ablatePrecision", {"search": True}, "'ablatePrecision' is not supported with ranks yet")])
def test_hostile_arguments_are_refused_in_words_and_the_ranks_go_on(ranks, command, arguments, words):
    refused(ranks, command, arguments, words)
    assert ranks.request("referenceValue", {"name": "x"})["rank"] == 0  # no frame: the rank the stop is about
