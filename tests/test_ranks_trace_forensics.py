"""Forensics of ranks opened from their traces, and replicas checked by a goto (docs/ranks.md, "Forensics per rank",
"Replicas"). A trace holds each rank's Program with its inputs and parameters, so ranks opened from an index run
their float64 reference passes as live ranks do, every collective for real through a gloo group of their own: the
planted float16 sum of rank 1 (tests/models/ranks/precision_on_one_rank.py), recorded on 2 ranks and opened, gives
the live run's answer. A goto forward past a replica's write where the ranks differ stops there, as a forward motion
does (tests/models/ranks/drifting_replicas.py). Real rank processes: one rank launcher and one DAP server."""

from __future__ import annotations

import json

import pytest

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from hardware.ticks import Direction
from tests.conftest import MODELS, line_of
from tests.dap.wire import Debugger, SchemaCheck

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
MODEL = MODELS / "ranks" / "precision_on_one_rank.py"
DRIFT_MODEL = MODELS / "ranks" / "drifting_replicas.py"
BUG = line_of(MODEL, "# BUG")
UPDATE = f"drifting_replicas.py:{line_of(DRIFT_MODEL, '# UPDATE')}"
SCHEMA = SchemaCheck()


@pytest.fixture(scope="module")
def recorded(launcher, tmp_path_factory) -> tuple[str, dict]:
    """The planted model run live on 2 ranks to its end and recorded (the index's path), and its live forensics."""
    index = str(tmp_path_factory.mktemp("recorded") / "run.rwtrace")
    with Coordinator(str(MODEL), 2, timeout_s=120, launcher=launcher, record=index) as ranks:
        assert ranks.run().reason == "end"
        live = ranks.forensics()
    assert live["divergence"]["rank"] == 1 and live["divergence"]["source"]["line"] == BUG
    return index, live


@pytest.fixture(scope="module")
def server():
    debugger = Debugger.spawn(SCHEMA)
    yield debugger
    debugger.close()
    assert SCHEMA.failures == [], "messages that break the DAP schema"


def _where(ranks: Coordinator, rank: int) -> dict:
    return ranks.ask(rank, {"op": "where"}, "saying where it is")


def test_forensics_of_an_opened_index_gives_the_answer_of_the_live_run_that_recorded_it(recorded, launcher):
    index, live = recorded
    with Coordinator(trace=index, timeout_s=120, launcher=launcher) as opened:
        assert opened.forensics() == live
        assert opened.forensics() == live  # the reference passes are kept
        # The ranks' own passes ran no collective: rank 0's all_reduce, rerun on the reference's inputs, gave the
        # result its trace holds.
        assert [_where(opened, r)["calls"] for r in (0, 1)] == [0, 0] and _where(opened, 0)["replayed"] >= 1


def test_a_recording_cut_short_is_refused_until_its_ranks_run_on_to_the_end(recorded, launcher, tmp_path):
    index = str(tmp_path / "cut.rwtrace")
    with Coordinator(str(MODEL), 2, timeout_s=120, launcher=launcher, record=index) as ranks:
        ranks.step(Direction.FORWARD, "node")  # before any rank's all_reduce: the traces hold none
    with Coordinator(trace=index, timeout_s=120, launcher=launcher) as opened:
        with pytest.raises(RewindError) as caught:
            opened.forensics()
        assert str(caught.value) == ("forensics compares each rank's whole pass with its reference: run every rank "
                                     "to the end of its program first (rank 0 has run 0 of its 1 collective(s))")
        assert opened.run().reason == "end"  # past the recording, on the CPU: the all_reduce runs with the peers
        assert [_where(opened, r)["calls"] for r in (0, 1)] == [1, 1]
        assert opened.forensics() == recorded[1]


def test_an_index_whose_collectives_run_on_subgroups_refuses_forensics_in_words(launcher, tmp_path):
    index = str(tmp_path / "mesh.rwtrace")
    with Coordinator(str(MODELS / "ranks" / "two_groups.py"), 4, timeout_s=120, launcher=launcher,
                     record=index) as ranks:
        assert ranks.run().reason == "end"
    with Coordinator(trace=index, timeout_s=120, launcher=launcher) as opened:
        with pytest.raises(RewindError) as caught:
            opened.forensics()
        words = str(caught.value)
        assert words.startswith("forensics of ranks opened from their traces runs the reference passes' collectives "
                                "on the world's process group only, and rank 0's collectives run on process group '")
        assert words.endswith("(ranks 0, 2), which ranks opened from traces do not make (their model's build() does "
                              "not run): launch the program with ranks instead")
        assert opened.run(Direction.REVERSE).reason == "entry"  # the ranks go on


def test_through_the_wire_an_opened_index_answers_first_divergence_and_each_ranks_reference(recorded, server):
    index, live = recorded
    assert server.start(MODEL, trace=index, stopOnEntry=True)["reason"] == "entry"
    body = server.request("firstDivergence", {})
    for finding in [body["divergence"]] + [r["divergence"] for r in body["ranks"]]:
        assert finding.pop("origin") is None and "not traced with ranks" in finding.pop("originReason")
    assert body == json.loads(json.dumps(live))
    rows = {r: {row["node"]: row for row in server.request("compareWithReference", {"threadId": r + 1,
                                                                                     "introduced": True})["rows"]}
            for r in (0, 1)}
    assert rows[1]["sum_1"]["verdict"] == "introduced" and rows[0]["sum_1"]["verdict"] == "within"
    reduce = rows[0]["all_reduce"]  # carried in from rank 1, as on the live ranks
    assert (reduce["verdict"], reduce["introduced"], reduce["carriedBy"]["from"]) == ("inherited", None, [1])


# -- replicas checked by a goto ------------------------------------------------------------------------------------
def test_a_goto_forward_past_drifting_replicas_stops_at_their_write_and_a_goto_back_checks_nothing(launcher):
    with Coordinator(str(DRIFT_MODEL), 2, timeout_s=120, launcher=launcher, replicas=["updated"]) as ranks:
        end = ranks.states()[1]["end"]
        stop = ranks.goto(end, 1)  # crosses both all_reduces with rank 0, past each rank's write of `updated`
        assert (stop.reason, stop.rank, stop.finding) == ("exception", 1, True)
        assert stop.description.startswith(f"replicas differ: 'updated' (sub) written by sub at {UPDATE} on rank 1")
        assert stop.exception["filter"] == "replicas"
        written = stop.exception["evidence"]["ticks"]
        assert stop.ticks == {r: t + 1 for r, t in written.items()}  # every rank right after its own write
        reads = ranks.replicas.reads
        back = ranks.goto(0, 1)
        assert (back.reason, ranks.replicas.reads) == ("goto", reads)  # back: no rank asked for its writes
        assert ranks.goto(written[1], 1).reason == "goto"  # forward to right before the write: nothing passed
        assert ranks.goto(end, 1).reason == "exception"  # over it again: the same stop
        assert ranks.goto(end, 1).ticks[1] == end  # and past it, none


def test_through_the_wire_a_goto_past_drifting_replicas_stops_with_the_replicas_exception(server):
    stop = server.motion("restart", {"arguments": {"program": str(DRIFT_MODEL), "ranks": 2, "stopOnEntry": True,
                                                   "replicas": ["updated"]}})
    assert stop["reason"] == "entry"
    end = server.request("timeline", {"count": 0, "threadId": 2})["end"]
    stop = server.motion("goto", {"threadId": 2, "targetId": end + 1})
    assert (stop["reason"], stop["text"], stop["threadId"]) == ("exception", "Replicas", 2)
    info = server.request("exceptionInfo", {"threadId": 2})
    assert info["exceptionId"] == "replicas" and info["description"] == stop["description"]
