"""Point-to-point sends and recvs under consistent cuts (docs/ranks.md, "Point-to-point send and recv"): real rank
processes in one gloo group, at the Python level. A send and its recv run together while the other ranks run on;
no stop leaves a rank past a recv whose send its peer has not run, nor past a send whose recv has not run; going
back and forward again across them runs no transfer again; a send and recv that disagree, ranks that wait for one
another, and a send no recv matches stop the session before any rank blocks."""

from __future__ import annotations

import pytest
import torch

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from hardware.ticks import Direction
from tests.conftest import EXAMPLES, MODELS, fresh_module, line_of

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
PIPELINE = EXAMPLES / "pipeline_parallel.py"
P2P = MODELS / "ranks" / "point_to_point.py"
SEND, RECV = line_of(PIPELINE, "# SEND"), line_of(PIPELINE, "# RECV")


@pytest.fixture(scope="module")
def pipeline(launcher):
    """The pipeline example on 4 ranks, with a ring so small that values are recomputed when read back."""
    with Coordinator(str(PIPELINE), 4, budget_mb=0.0005, timeout_s=120, launcher=launcher) as c:
        yield c


def _planted(launcher, entry: str) -> Coordinator:
    return Coordinator(str(P2P), 2, entry=entry, timeout_s=120, launcher=launcher)


def _consistent(c: Coordinator) -> None:
    """No rank has passed a collective, send or recv that a partner of it has not passed."""
    passed = {r: s["passed"] for r, s in c.states().items()}
    for r in passed:
        for number in range(1, passed[r] + 1):
            for q, m in c.partners(r, number).items():
                assert m <= passed[q], (r, number, q, m, passed)


def _outputs(c: Coordinator) -> dict[int, list[int]]:
    return {r: c.tensor(r, c.outputs(r)[0])["bytes"] for r in range(c.world_size)}


def test_a_pipeline_runs_to_the_output_of_one_process_with_its_sends_paired_to_their_recvs(pipeline):
    assert [c.describe() for c in pipeline.collectives(1)] == [
        f"irecv #1 (float32[3,8] from rank 0) at pipeline_parallel.py:{RECV}",
        f"isend #2 (float32[3,8] to rank 2) at pipeline_parallel.py:{SEND}",
        f"irecv #3 (float32[3,8] from rank 0) at pipeline_parallel.py:{RECV}",
        f"isend #4 (float32[3,8] to rank 2) at pipeline_parallel.py:{SEND}",
        f"all_reduce #5 (float32[], sum) at pipeline_parallel.py:{line_of(PIPELINE, '# ENERGY')}"]
    assert pipeline.partners(1, 2) == {1: 2, 2: 1}  # rank 1's first send is rank 2's first recv
    assert pipeline.partners(3, 3) == {0: 3, 1: 5, 2: 5, 3: 3}  # the all_reduce: every rank's, each its own number
    assert pipeline.run().reason == "end"
    out, energy = fresh_module(PIPELINE).reference(4)
    last = pipeline.tensor(3, pipeline.outputs(3)[0])
    assert torch.allclose(torch.tensor(last["values"]).reshape(last["shape"])[-1], out[-1], atol=1e-6)
    for r in range(4):
        assert pipeline.tensor(r, pipeline.outputs(r)[1])["values"] == pytest.approx([float(energy)], rel=1e-5)


def test_every_stop_is_a_consistent_cut_and_a_pair_crosses_while_the_others_run(pipeline):
    pipeline.goto(0)
    seen = set()
    for motion in [lambda: pipeline.step(kind="node")] * 9 + [lambda: pipeline.step(Direction.REVERSE, "node")] * 4:
        motion()
        _consistent(pipeline)
        seen.add(tuple(s["passed"] for s in pipeline.states().values()))
    assert len({p for passed in seen for p in passed}) > 2  # ranks stood at different numbers of transfers
    assert any(len(set(passed)) > 1 for passed in seen)
    pipeline.run(Direction.REVERSE)
    _consistent(pipeline)


def test_a_rank_alone_stops_before_its_recv_and_every_rank_then_crosses_it(pipeline):
    pipeline.goto(0)
    stop = pipeline.run(rank=2, single=True)
    assert stop.description == (f"rank 2: waits before irecv #1 (float32[3,8] from rank 1) at "
                                f"pipeline_parallel.py:{RECV}")
    assert pipeline.states()[1]["passed"] == 0  # rank 1 has not moved
    again = pipeline.step(kind="node", rank=2, single=True)
    assert "alone it stays here" in again.description and pipeline.states()[2]["passed"] == 0
    waits = pipeline.step(kind="node", rank=2)  # every rank steps: rank 2 waits, its peers move
    assert (waits.rank, waits.description) == (2, f"rank 2: waits before irecv #1 (float32[3,8] from rank 1) at "
                                                  f"pipeline_parallel.py:{RECV}, until its partners reach it (the "
                                                  "step moved rank 0, rank 1, rank 3)")
    while pipeline.states()[2]["passed"] == 0:
        pipeline.step(kind="node", rank=2)
        _consistent(pipeline)
    assert pipeline.states()[1]["passed"] >= 2  # rank 1 ran its recv from rank 0 and its send to rank 2 first


def test_stepping_back_across_a_send_and_recv_and_forward_again_is_bit_identical_and_sends_nothing_again(pipeline):
    pipeline.run()
    before = _outputs(pipeline)
    first, second = pipeline.collectives(3)[:2]  # rank 3's recvs
    received = pipeline.tensor(3, first.value)["bytes"]
    calls = {r: s["calls"] for r, s in pipeline.states().items()}
    pipeline.goto(second.tick, 3)  # back across the sends and recvs after rank 3's first recv
    _consistent(pipeline)
    assert pipeline.states()[3]["passed"] == 1 and pipeline.states()[2]["passed"] == 3  # its send not run yet
    assert pipeline.tensor(3, first.value)["bytes"] == received  # evicted by the tiny ring: the recorded recv's
    assert pipeline.run().reason == "end"  # forward again: the recorded transfers
    assert _outputs(pipeline) == before
    states = pipeline.states()
    assert {r: s["calls"] for r, s in states.items()} == calls  # no send or recv ran again
    assert states[3]["recomputed"] > 0 and states[3]["replayed"] > 0


def test_a_ring_exchange_in_one_batch_runs_on_four_ranks(launcher):
    with Coordinator(str(P2P), 4, entry="ring", timeout_s=120, launcher=launcher) as ring:
        assert ring.collectives(0)[0].describe() == (
            f"batch_p2p_ops #1 (send float32[4] to rank 1, recv float32[4] from rank 3) at "
            f"point_to_point.py:{line_of(P2P, '# EXCHANGE')}")
        assert ring.run().reason == "end"
        for r in range(4):  # every rank sums each rank's doubled shard, received from its neighbour, plus one
            assert ring.tensor(r, ring.outputs(r)[0])["values"] == [124.0, 132.0, 140.0, 148.0]
        assert ring.run(Direction.REVERSE).reason == "entry"


@pytest.mark.parametrize("entry, words", [
    ("deadlock", "rank 0 calls isend #1 (float32[4] to rank 1) at point_to_point.py:{BOTH SEND}, which rank 1 joins "
                 "only later, at irecv #2 (float32[4] from rank 0) at point_to_point.py:{BOTH RECV}; rank 1 calls "
                 "isend #1 (float32[4] to rank 0) at point_to_point.py:{BOTH SEND}, which rank 0 joins only later, "
                 "at irecv #2 (float32[4] from rank 1) at point_to_point.py:{BOTH RECV}: no rank can go on (a "
                 "collective, a send or a recv runs only with its partners)"),
    ("sizes", "rank 0 calls isend #1 (float32[8] to rank 1) at point_to_point.py:{SENDS 8}; rank 1 calls irecv #1 "
              "(float32[4] from rank 0) at point_to_point.py:{RECEIVES 4}: rank 0 sends float32[8] and rank 1 "
              "receives float32[4]"),
    ("unmatched", "rank 0 calls isend #2 (float32[4] to rank 1) at point_to_point.py:{SECOND SEND}, and rank 1 has "
                  "no recv to match it; rank 1 calls all_reduce #2 (float32[4], sum) at point_to_point.py:"
                  "{THEN SUM}, which rank 0 joins only later, at all_reduce #3 (float32[4], sum) at "
                  "point_to_point.py:{THEN SUM}: no rank can go on")])
def test_a_planted_send_or_recv_bug_stops_every_rank_before_any_blocks(launcher, entry, words):
    for marker in ("BOTH SEND", "BOTH RECV", "SENDS 8", "RECEIVES 4", "SECOND SEND", "THEN SUM"):
        words = words.replace("{" + marker + "}", str(line_of(P2P, f"# {marker}")))
    with _planted(launcher, entry) as c:
        stop = c.run()
        assert stop.reason == "exception" and stop.finding and stop.rank == 0
        assert stop.description.startswith(words)
        assert all(s["at_fence"] for s in c.states().values())  # each waits before its send or recv, none in it
        calls = {r: s["calls"] for r, s in c.states().items()}
        assert c.values(1) and c.frames(0)  # every rank alive and inspectable
        assert c.run().description == stop.description  # asked again: the same stop, nothing run
        assert c.step(Direction.REVERSE).reason == "step"
        assert c.run(Direction.REVERSE).reason == "entry"
        assert {r: s["calls"] for r, s in c.states().items()} == calls


def test_a_nan_a_send_carried_is_traced_to_the_rank_and_line_of_its_birth(launcher):
    born, carries, arrives = (line_of(P2P, m) for m in ("# BORN", "# CARRIES", "# ARRIVES"))
    with _planted(launcher, "nan") as c:
        c.set_exception_filters(["nan"])
        birth = c.run()
        assert (birth.reason, birth.rank) == ("exception", 0)
        assert birth.description.startswith(f"rank 0: NaN born on rank 0 at point_to_point.py:{born}; isend at "
                                            f"point_to_point.py:{carries} will carry it to rank 1 (")
        carried = c.run()
        assert (carried.reason, carried.rank) == ("exception", 1)
        assert carried.description.startswith(f"rank 1: NaN born on rank 0 at point_to_point.py:{born}; isend at "
                                              f"point_to_point.py:{carries} carried it to rank 1 (")
        assert f"point_to_point.py:{arrives}" in carried.description  # the recv that wrote it on rank 1
        evidence = carried.exception["evidence"]
        assert evidence["carriedBy"] == {"collective": "isend", "number": 1, "node": "isend",
                                         "source": f"point_to_point.py:{carries}", "rank": 0}
        assert evidence["carriedTo"] == [1] and [b["rank"] for b in evidence["born"]] == [0]


def test_forensics_names_the_send_that_carried_an_error_into_an_exact_rank(launcher):
    bug, sends = line_of(P2P, "# BUG"), line_of(P2P, "# SENDS SUMS")
    with _planted(launcher, "precision") as c:
        assert c.run().reason == "end"
        found = c.forensics()
        assert found["headline"] == (f"rank 0 introduces the error at point_to_point.py:{bug} (`sum_1`); isend #1 "
                                     f"at point_to_point.py:{sends} carried it to rank 1")
        carried = found["ranks"][1]["divergence"]["carriedBy"]
        assert (carried["collective"], carried["rank"], carried["from"]) == ("isend", 0, [0])


def test_a_recording_of_a_pipeline_opens_post_mortem_with_its_transfers(launcher, tmp_path):
    index = tmp_path / "pipe.rwtrace"
    with Coordinator(str(PIPELINE), 2, timeout_s=120, launcher=launcher, record=str(index)) as live:
        live.run()
        recorded = _outputs(live)
    with Coordinator(trace=str(index), timeout_s=120, launcher=launcher) as traced:
        assert traced.collectives(0)[0].p2p == (("send", 1, 0, "float32[3,8]"),)
        assert traced.run().reason == "end" and _outputs(traced) == recorded
        traced.goto(traced.collectives(1)[1].tick, 1)  # back across rank 1's second recv
        _consistent(traced)
        assert traced.states()[0]["passed"] == 1
        assert traced.run().reason == "end" and _outputs(traced) == recorded


def test_a_send_to_itself_is_refused_at_launch(launcher, tmp_path):
    model = tmp_path / "to_itself.py"
    model.write_text("import torch\nimport torch.distributed._functional_collectives as funcol\n\n\n"
                     "class M(torch.nn.Module):\n    def forward(self, x):\n"
                     "        funcol.isend_inplace(x, 0)  # TO ITSELF\n        return x + 1\n\n\n"
                     "def build(rank, world_size):\n    return M(), (torch.ones(2),)\n")
    with pytest.raises(RewindError, match=r"rank 0: isend #1 \(float32\[2\] to rank 0\) at to_itself.py:7 sends to "
                                          r"itself"):
        Coordinator(str(model), 2, launcher=launcher)


def test_a_nan_relayed_through_a_middle_stage_names_where_it_was_born_and_the_send_that_brought_it(launcher):
    with Coordinator(str(P2P), 3, entry="relay", timeout_s=120, launcher=launcher) as c:
        c.set_exception_filters(["nan"])
        stops = [c.run() for _ in range(3)]
        assert [(s.reason, s.rank) for s in stops] == [("exception", 0), ("exception", 1), ("exception", 2)]
        assert stops[2].description.startswith(
            f"rank 2: NaN born on rank 0 at point_to_point.py:{line_of(P2P, '# RELAY BORN')} (relayed by rank 1); "
            f"isend at point_to_point.py:{line_of(P2P, '# RELAYS')} carried it to rank 2 (")
        assert stops[2].exception["evidence"]["carriedBy"]["rank"] == 1


@pytest.mark.parametrize("entry, words", [
    ("misshapen", "batch_p2p_ops at point_to_point.py:{BATCH} has 2 op(s), 1 peer(s), 1 tag(s) and 2 tensor(s): a "
                  "batch gives one of each per transfer"),
    ("misnamed", "batch_p2p_ops at point_to_point.py:{BATCH} names op 'send': a batch's ops are 'isend' and "
                 "'irecv'")])
def test_a_batch_torch_export_lets_through_malformed_is_refused_at_launch_in_words(launcher, entry, words):
    with pytest.raises(RewindError) as refused:
        _planted(launcher, entry)
    assert f"rank 0: {words.replace('{BATCH}', str(line_of(P2P, '# BATCH')))}" in str(refused.value)


def test_a_batch_its_peer_answers_in_two_nodes_is_said_to_need_them_batched(launcher):
    with _planted(launcher, "half_batched") as c:
        stop = c.run()
        assert stop.reason == "exception" and stop.description.startswith(
            f"rank 0 calls batch_p2p_ops #1 (send float32[4] to rank 1, recv float32[4] from rank 1) at "
            f"point_to_point.py:{line_of(P2P, '# BOTH AT ONCE')}, which rank 1 joins only in separate steps, at irecv "
            f"#1 (float32[4] from rank 0) at point_to_point.py:{line_of(P2P, '# FIRST RECV')} and isend #2 "
            f"(float32[4] to rank 0) at point_to_point.py:{line_of(P2P, '# THEN SEND')} (a batch runs only with "
            "every partner waiting at once: batch rank 1's too)")


def test_a_goto_that_meets_a_deadlock_moves_no_rank_it_does_not_need(launcher):
    with Coordinator(str(P2P), 4, entry="beside", timeout_s=120, launcher=launcher) as c:
        stop = c.goto(c.states()[0]["end"], 0)
        assert stop.reason == "exception" and stop.rank == 0 and "no rank can go on" in stop.description
        assert [s["calls"] for s in c.states().values()] == [0, 0, 0, 0]
        assert [s["tick"] for s in c.states().values()][2:] == [0, 0]  # the pair beside stays where it was


def test_a_batch_carries_a_nan_only_to_the_ranks_it_sends_to_and_from_the_ranks_it_receives_from(launcher):
    born, passes = line_of(P2P, "# RING BORN"), line_of(P2P, "# PASS ON")
    with Coordinator(str(P2P), 3, entry="ring_nan", timeout_s=120, launcher=launcher) as c:
        c.set_exception_filters(["nan"])
        first = c.run()
        assert first.description.startswith(f"rank 0: NaN born on rank 0 at point_to_point.py:{born}; batch_p2p_ops "
                                            f"at point_to_point.py:{passes} will carry it to rank 1 (")
        stops = [c.run() for _ in range(4)]
        on_two = next(s for s in stops if s.rank == 2)
        assert on_two.description.startswith(f"rank 2: NaN born on rank 1 at point_to_point.py:{born}; "
                                             f"batch_p2p_ops at point_to_point.py:{passes} carried it to rank 2 (")
        assert [b["rank"] for b in on_two.exception["evidence"]["born"]] == [1]
