"""Stepping one rank alone through the wire (DAP `singleThread`; docs/ranks.md, "Stepping one rank"): the thread's
rank moves, its peer stays where it is, and no rank ever passes a collective its peer has not reached. One server for
the module, with examples/tensor_parallel.py on 2 real ranks in one gloo group."""

from __future__ import annotations


import pytest

from tests.conftest import EXAMPLES, line_of
from tests.dap.wire import Debugger, rank_ticks, refused

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
TENSOR_PARALLEL = EXAMPLES / "tensor_parallel.py"
REDUCE = f"all_reduce #1 (float32[4,8], sum) at tensor_parallel.py:{line_of(TENSOR_PARALLEL, 'funcol.all_reduce(')}"
ALONE = {"singleThread": True}


@pytest.fixture(scope="module")
def ranked(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(TENSOR_PARALLEL, stopOnEntry=True, ranks=2)["reason"] == "entry"
    yield debugger
    debugger.close()


@pytest.fixture
def entry(ranked: Debugger) -> Debugger:
    assert ranked.motion("restart", {})["reason"] == "entry"
    return ranked


def test_the_server_says_it_steps_one_thread_alone(ranked):
    capabilities = next(m["body"] for m in ranked.messages
                        if m.get("type") == "response" and m.get("command") == "initialize")
    assert capabilities["supportsSingleThreadExecutionRequests"] is True


def test_a_step_of_one_rank_moves_it_alone(entry):
    stop = entry.motion("next", {"threadId": 2, **ALONE})
    assert (stop["reason"], stop["threadId"]) == ("step", 2)
    assert stop["description"].startswith("rank 1: ")
    moved = rank_ticks(stop)
    assert moved[0] == 0 < moved[1]  # rank 0 stays on entry
    deeper = rank_ticks(entry.motion("stepIn", {"threadId": 2, **ALONE}))
    assert deeper[0] == 0 and deeper[1] > moved[1]
    stop = entry.motion("stepIn", {"threadId": 1, **ALONE})  # now rank 0 alone; rank 1 stays
    assert stop["threadId"] == 1 and rank_ticks(stop)[0] > 0 and rank_ticks(stop)[1] == deeper[1]


def test_a_rank_alone_goes_no_further_than_its_next_collective_and_says_why_it_stays(entry):
    mark = entry.client.mark()
    assert entry.request("continue", {"threadId": 2, **ALONE}) == {"allThreadsContinued": False}
    stop = entry.client.wait_for("stopped", after=mark)
    assert stop["description"].startswith(f"rank 1: waits before {REDUCE}")
    waiting = rank_ticks(stop)
    assert waiting[0] == 0  # rank 0 has not moved: rank 1 did not run the all_reduce without it
    for command in ("next", "stepOut", "continue"):
        stop = entry.motion(command, {"threadId": 2, **ALONE})
        assert stop["reason"] == "step" and rank_ticks(stop) == waiting
        assert f"rank 1: waits before {REDUCE}, which runs only with every rank: alone it stays here" in \
            stop["description"]
    entry.motion("continue", {"threadId": 1, **ALONE})  # rank 0 to its all_reduce too
    stop = entry.motion("next", {"threadId": 1})  # every rank waits at it: a step of every rank runs it together
    assert all(t > w for t, w in zip(rank_ticks(stop), waiting))


def test_a_rank_stepped_back_alone_stops_right_after_its_last_collective(entry):
    entry.motion("continue", {"threadId": 1, **ALONE})
    entry.motion("continue", {"threadId": 2, **ALONE})
    crossed = rank_ticks(entry.motion("next", {"threadId": 1}))  # both ran all_reduce #1, together
    ahead = rank_ticks(entry.motion("next", {"threadId": 2, **ALONE}))
    assert ahead[0] == crossed[0] and ahead[1] > crossed[1]
    stop = entry.motion("reverseContinue", {"threadId": 2, **ALONE})  # back, but not across the all_reduce
    assert stop["description"].startswith(f"rank 1: waits after {REDUCE}")
    after = rank_ticks(stop)  # the instant right after the all_reduce ran (its result not yet waited for)
    assert after[0] == crossed[0] and 0 < after[1] <= crossed[1]
    stop = entry.motion("stepBack", {"threadId": 2, **ALONE})
    assert f"rank 1: waits after {REDUCE}; going back across a collective takes every rank: alone it stays" in \
        stop["description"]
    assert rank_ticks(stop) == after
    assert entry.motion("reverseContinue", {"threadId": 1})["reason"] == "entry"  # every rank back across it


def test_reads_over_a_whole_run_answer_per_rank_once_every_rank_has_run_it(entry):
    stop = entry.motion("continue", {"threadId": 1})
    assert stop["reason"] == "end"
    histories = [entry.request("writeHistory", {"name": "h", "threadId": t}) for t in (1, 2)]
    assert [h["rank"] for h in histories] == [0, 1]
    digests = [[w["digest"] for w in h["writes"]] for h in histories]
    assert len(digests[0]) == len(digests[1]) == 2 and digests[0] != digests[1]  # each rank's slice of each block
    events = entry.request("timelineEvents", {"threadId": 2})
    assert events["rank"] == 1 and events["end"] == rank_ticks(stop)[1]
    assert not [e for e in events["events"] if e["event"] == "stop"]  # the stops before its collectives are no one's


@pytest.mark.parametrize("arguments, words", [
    ({"threadId": 3, **ALONE}, "no thread 3"),
    ({"threadId": 2, "singleThread": "yes"}, "singleThread"),
    ({"threadId": 2, "targetId": 10_000, **ALONE}, "target 10000 is not a node still to run on rank 1's line")])
def test_a_step_of_one_rank_that_names_no_rank_or_is_malformed_is_refused(ranked, arguments, words):
    refused(ranked, "stepIn", arguments, words)
