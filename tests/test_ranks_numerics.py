"""Cross-rank numerics (docs/ranks.md, "Cross-rank numerics"): a NaN born on one rank and carried to its peers by an
all_reduce is traced to the rank and line where it was born, and the replicas check stops where values that must be
identical on every rank first differ. Real rank processes in one gloo group: one rank launcher for the module's
coordinators, and one DAP server for the wire's tests."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from hardware.ranks.numerics import difference
from hardware.ticks import Direction
from tests.conftest import MODELS, line_of
from tests.dap.wire import Debugger, SchemaCheck, refused

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
NAN_MODEL = MODELS / "ranks" / "planted_nan_rank.py"
DRIFT_MODEL = MODELS / "ranks" / "drifting_replicas.py"
BORN, SPREAD = (f"planted_nan_rank.py:{line_of(NAN_MODEL, m)}" for m in ("# BUG", "# SPREAD"))
DRIFT, UPDATE = (f"drifting_replicas.py:{line_of(DRIFT_MODEL, m)}" for m in ("# DRIFT", "# UPDATE"))


@pytest.fixture(scope="module")
def drifting(launcher):
    with Coordinator(str(DRIFT_MODEL), 2, timeout_s=120, launcher=launcher) as c:
        yield c


def test_a_nan_born_on_one_rank_is_traced_to_its_rank_line_and_the_collective_that_carried_it(launcher):
    with Coordinator(str(NAN_MODEL), 4, timeout_s=120, launcher=launcher) as c:
        c.set_exception_filters(["nan"])
        birth = c.run()  # rank 1 alone makes the NaN, before the all_reduce
        assert (birth.reason, birth.rank) == ("exception", 1)
        assert f"born on rank 1 at {BORN}; all_reduce at {SPREAD} will carry it to ranks 0, 2, 3" in birth.description
        carried = c.run()  # the all_reduce: every other rank gets it from finite inputs of its own
        assert (carried.reason, carried.rank) == ("exception", 0)
        words = f"born on rank 1 at {BORN}; all_reduce at {SPREAD} carried it to ranks 0, 2, 3"
        assert carried.description.startswith(f"rank 0: NaN {words} (1 NaN written to 'all_reduce'")
        evidence = carried.exception["evidence"]
        assert (carried.exception["filter"], evidence["message"], evidence["carriedTo"]) == ("nan", words, [0, 2, 3])
        born, = evidence["born"]
        assert (born["rank"], born["source"], born["tick"]) == (1, BORN, birth.ticks[1] - 1)  # right after the write
        assert evidence["carriedBy"] == {"collective": "all_reduce", "number": 1, "node": "all_reduce",
                                         "source": SPREAD}
        assert c.step(Direction.REVERSE).reason == "step"  # back from there, through consistent cuts
        assert len({s["passed"] for s in c.states().values()}) == 1
        assert c.run(Direction.REVERSE).reason == "exception"  # back across the all_reduce to the birth on rank 1
        assert all(s["passed"] == 0 for s in c.states().values())


def test_a_nan_relayed_through_two_collectives_is_traced_to_the_rank_it_was_born_on(launcher):
    born, relay, relayed = (f"planted_nan_rank.py:{line_of(NAN_MODEL, m)}"
                            for m in ("# BUG, relayed", "# RELAY:", "# RELAYED"))
    with Coordinator(str(NAN_MODEL), 2, entry="relay", timeout_s=120, launcher=launcher) as c:
        c.set_exception_filters(["nan"])
        birth = c.run()  # the NaN's node runs right before the collective: its stop is not hidden by the collective's
        assert (birth.rank, birth.exception["evidence"]["carriedTo"]) == (1, [0])
        assert f"born on rank 1 at {born}; all_to_all_single at {relay} will carry it to rank 0" in birth.description
        assert f"born on rank 1 at {born}; all_to_all_single at {relay} carried it to rank 0" in c.run().description
        back = c.run()  # rank 0 sends it back to rank 1, whose own input to the all_reduce was finite
        assert back.rank == 1 and f"born on rank 1 at {born} (relayed by rank 0); all_reduce at {relayed} carried " \
                                  "it to rank 1" in back.description
        assert back.exception["evidence"]["born"][0]["relayedBy"] == 0


def test_replicas_that_stay_identical_run_to_the_end_without_a_stop(drifting):
    drifting.set_replicas(["grad", "gra*"])  # the all_reduced gradient: the same on every rank
    try:
        assert drifting.run().reason == "end"
    finally:
        drifting.set_replicas(None)
        drifting.goto(0)


def test_drifting_replicas_stop_at_the_first_differing_write_naming_the_node_and_step_back_works(drifting):
    drifting.set_replicas(["updated"])
    try:
        stop = drifting.run()
        assert (stop.reason, stop.rank, stop.finding) == ("exception", 1, True)
        assert stop.description.startswith(f"replicas differ: 'updated' (sub) written by sub at {UPDATE} on rank 1 "
                                           f"differs from rank 0 (max abs difference ")
        assert stop.description.endswith(f"the first node where they differ: mul at {DRIFT}")
        evidence = stop.exception["evidence"]
        assert (evidence["agree"], evidence["differ"], evidence["count"]) == ([0], [1], 8)
        assert 1e-5 < evidence["maxAbsDifference"] < 1e-3 and evidence["firstIndex"] == [0, 0]
        assert (evidence["firstDifference"]["node"], evidence["firstDifference"]["reads"]) == ("mul", [])
        written = {r: evidence["ticks"][r] for r in (0, 1)}
        assert stop.ticks == {r: t + 1 for r, t in written.items()}  # every rank right after its own write
        assert drifting.step(Direction.REVERSE).reason == "step"
        assert all(s["tick"] <= written[r] for r, s in drifting.states().items())
        assert drifting.run().reason == "exception"  # forward again over the same write: the same stop
        assert drifting.run().reason == "end"  # and past it, no other
    finally:
        drifting.set_replicas(None)
        drifting.goto(0)


@pytest.mark.parametrize("replicas, words", [
    ("updated", "replicas is a list of value names or patterns"), ([], "replicas is a list"),
    ([3], "replicas is a list"), (["nope*"], "replicas: 'nope*' names no variable, parameter or value"),
    (["w"], "replicas: 'w' names only parameters or inputs, which no node writes")])
def test_replicas_that_name_nothing_or_are_no_list_are_refused_in_words(drifting, replicas, words):
    with pytest.raises(RewindError) as caught:
        drifting.set_replicas(replicas)
    assert str(caught.value).startswith(words)


def test_exception_filters_that_are_no_list_are_refused(drifting):
    with pytest.raises(RewindError, match="exception filters are a list of names"):
        drifting.set_exception_filters("nan")
    with pytest.raises(RewindError, match="unknown exception filter"):
        drifting.set_exception_filters(["nope"])


def test_stepping_node_by_node_asks_the_ranks_for_replica_writes_only_after_a_step_that_made_one(drifting):
    drifting.set_replicas(["grad"])  # written once per rank, at its producer's tick
    try:
        steps = 0
        while drifting.step(Direction.FORWARD, "node").reason != "end":
            steps += 1
        assert steps > 8 and drifting.replicas.reads == 1
    finally:
        drifting.set_replicas(None)
        drifting.goto(0)


@pytest.mark.parametrize("a, b, words", [
    (torch.ones(4), torch.ones(4, dtype=torch.float16), "rank 0 holds float32[4], rank 1 float16[4]"),
    (torch.ones(4), torch.ones(2, 2), "rank 0 holds float32[4], rank 1 float32[2,2]"),
    (torch.ones(2, dtype=torch.complex128), torch.zeros(2, dtype=torch.complex128),
     "the ranks hold complex128[2], whose 16-byte elements are not compared bit for bit")])
def test_replicas_of_another_shape_or_dtype_or_of_wide_elements_are_compared_by_digest_only(a, b, words):
    assert difference(a, b, 0, 1) == {"maxAbsDifference": None, "firstIndex": None, "count": 0, "elements": 0,
                                      "amountReason": f"compared by digest only: {words}"}


def test_replicas_of_one_shape_and_dtype_are_compared_element_by_element():
    a = torch.tensor([[1 + 1j, 2j], [3, 4]], dtype=torch.complex64)
    b = a.clone()
    b[1, 0] = 3 + 4j
    assert difference(a, b, 0, 1) == {"maxAbsDifference": 4.0, "firstIndex": [1, 0], "count": 1, "elements": 4}


def test_a_rank_gone_while_the_replicas_check_puts_the_ranks_at_the_drift_is_the_stop(drifting):
    """The module's last test of `drifting`: it ends rank 1's process."""
    drifting.set_replicas(["updated"])
    stop = drifting.run()  # the drift: every rank right after its own write
    written = {r: t - 1 for r, t in stop.ticks.items()}
    pid = drifting.pids()[1]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The same write checked again as a motion over it: its writes are read already, but rank 1 cannot be put there.
    words, rank, exception = drifting.replicas.check(drifting, written)
    assert words.startswith("rank 1 ended while going to a tick (exit code -9)") and (rank, exception) == (1, None)


# -- through the wire -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wire():
    schema = SchemaCheck()
    debugger = Debugger.spawn(schema)
    assert debugger.start(NAN_MODEL, stopOnEntry=True, ranks=2)["reason"] == "entry"
    yield debugger
    debugger.close()
    assert schema.failures == [], "messages that break the DAP schema"


def test_through_the_wire_a_carried_nan_names_the_rank_it_was_born_on(wire):
    birth = wire.motion("continue", {"threadId": 1})  # the NaN filter is on by default
    assert (birth["reason"], birth["threadId"]) == ("exception", 2)
    assert f"born on rank 1 at {BORN}; all_reduce at {SPREAD} will carry it to rank 0" in birth["description"]
    stop = wire.motion("continue", {"threadId": 1})
    words = f"born on rank 1 at {BORN}; all_reduce at {SPREAD} carried it to rank 0"
    assert (stop["reason"], stop["text"], stop["threadId"]) == ("exception", "NaN", 1)
    assert stop["description"].startswith(f"rank 0: NaN {words}")
    info = wire.request("exceptionInfo", {"threadId": 1})
    assert info["exceptionId"] == "nan" and info["description"].endswith(words)
    evidence = info["details"]["evidence"]
    assert [(b["rank"], b["source"]) for b in evidence["born"]] == [(1, BORN)]
    assert (evidence["carriedBy"]["source"], evidence["carriedTo"]) == (SPREAD, [0])


def test_through_the_wire_drifting_replicas_stop_with_the_replicas_exception(wire):
    program = {"program": str(DRIFT_MODEL), "ranks": 2, "stopOnEntry": True}
    refused(wire, "restart", {"arguments": {**program, "replicas": "updated"}},
             "field 'arguments.replicas': input should be a valid list")
    refused(wire, "restart", {"arguments": {"program": str(DRIFT_MODEL), "replicas": ["updated"]}},
             "'replicas' compares values across ranks: give 'ranks' too")
    refused(wire, "restart", {"arguments": {**program, "replicas": ["nope"]}}, "replicas: 'nope' names no variable")
    assert wire.motion("restart", {"arguments": {**program, "replicas": ["updated"]}})["reason"] == "entry"
    stop = wire.motion("continue", {"threadId": 1})
    assert (stop["reason"], stop["text"], stop["threadId"]) == ("exception", "Replicas", 2)
    info = wire.request("exceptionInfo", {"threadId": 2})
    assert (info["exceptionId"], info["details"]["typeName"]) == ("replicas", "Replicas")
    assert info["description"] == stop["description"] and "on rank 1 differs from rank 0" in info["description"]
    assert info["details"]["evidence"]["firstDifference"]["source"].endswith(DRIFT)
    assert wire.motion("stepBack", {"threadId": 2})["reason"] == "step"
    assert wire.motion("continue", {"threadId": 1})["text"] == "Replicas"  # forward over it again: the same stop
