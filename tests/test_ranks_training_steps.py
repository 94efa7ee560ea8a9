"""Many training steps on many ranks (examples/data_parallel.py with `steps`): every rank's Program is its training
step repeated, the gradient all_reduces numbered on across the steps, each step reading the parameters the step
before it updated. One 2-rank group of 3 steps serves the module, with a ring so small that values read back are
recomputed. Steps are counted from 0, as the Program counts them (`loss_step1` is the second step's loss); two
planted bugs that show only in a later step are launches of their own."""

from __future__ import annotations

import pytest
import torch

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from hardware.ticks import Direction
from tests.conftest import EXAMPLES, MODELS, fresh_module, line_of

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
DATA_PARALLEL = EXAMPLES / "data_parallel.py"
DECAY = MODELS / "ranks" / "decay_on_one_rank.py"
TWICE = MODELS / "ranks" / "hooked_twice.py"
STEPS = 3
PARAMETERS = ["up.weight", "up.bias", "down.weight", "down.bias"]  # data_parallel.MLP's, by module path


def _updated(path: str, step: int) -> str:
    """The Program value training step `step` (from 0) writes when it updates the parameter at module path `path`."""
    return f"p_{path.replace('.', '_')}_updated" + (f"_step{step}" if step else "")


@pytest.fixture(scope="module")
def trained(launcher):
    with Coordinator(str(DATA_PARALLEL), 2, entry="train_step", steps=STEPS, budget_mb=0.0005, timeout_s=120,
                     launcher=launcher, replicas=PARAMETERS) as c:
        yield c


def test_every_ranks_program_is_the_step_repeated_its_all_reduces_numbered_on_across_the_steps(trained):
    for r in range(2):
        collectives = trained.collectives(r)
        assert [c.number for c in collectives] == list(range(1, 4 * STEPS + 1))  # 4 parameters, 4 gradients a step
        assert {(c.op, c.where) for c in collectives} == {(c.op, c.where) for c in collectives[:4]}
        for step in range(STEPS):  # step k's are its own nodes, named as step 0's with _step<k>
            suffix = f"_step{step}" if step else ""
            assert [c.node for c in collectives[4 * step:4 * step + 4]] == [c.node + suffix for c in collectives[:4]]
        assert [c.tick for c in collectives] == sorted(c.tick for c in collectives)
    assert [c.tick for c in trained.collectives(0)] == [c.tick for c in trained.collectives(1)]


def test_each_step_trains_on_what_the_step_before_updated_as_one_process_does_on_the_whole_batch(trained):
    trained.goto(0)
    assert trained.run().reason == "end"  # the replicas agree after every step's update: no stop on the way
    assert set(trained.replicas.labels) == {_updated(p, k) for p in PARAMETERS for k in range(STEPS)}
    example = fresh_module(DATA_PARALLEL)
    for step in range(STEPS):
        expected = example.reference(step + 1)
        for path, want in expected.items():
            got = [trained.tensor(r, _updated(path, step)) for r in range(2)]
            assert got[0]["bytes"] == got[1]["bytes"], (step, path)  # replicas, bit for bit
            assert torch.allclose(torch.tensor(got[0]["values"]).reshape(want.shape), want, atol=1e-6), (step, path)
    losses = [trained.tensor(0, name)["values"] for name in ("loss", "loss_step1", "loss_step2")]
    assert losses[2] < losses[1] < losses[0]  # every step reads the update before it


def test_going_back_across_the_step_boundaries_restores_every_rank_bit_for_bit(trained):
    trained.goto(0)
    trained.run()
    last = trained.collectives(0)[-1]
    names = [last.value, "loss", "loss_step1"] + [_updated(p, k) for p in PARAMETERS for k in range(STEPS)]
    before = {r: [trained.tensor(r, n)["bytes"] for n in names] for r in range(2)}
    calls = {r: s["calls"] for r, s in trained.states().items()}
    second = trained.collectives(0)[4]  # step 1's first gradient all_reduce: back across step 2's and step 1's
    assert trained.goto(second.tick, 0).reason == "goto"
    assert [s["passed"] for s in trained.states().values()] == [4, 4]  # a consistent cut in step 1
    at_second = {r: [trained.tensor(r, n)["bytes"] for n in ("loss", _updated("up.weight", 0))] for r in range(2)}
    assert at_second == {r: [b[1], b[3]] for r, b in before.items()}  # step 0's, recomputed
    assert trained.run(Direction.REVERSE).reason == "entry"  # back across every step, to the beginning
    assert trained.run().reason == "end"  # and forward again: the recorded results, no all_reduce run again
    states = trained.states()
    assert {r: [trained.tensor(r, n)["bytes"] for n in names] for r in range(2)} == before
    assert {r: s["calls"] for r, s in states.items()} == calls
    assert all(s["replayed"] > 0 and s["recomputed"] > 0 for s in states.values())


def test_replicas_that_drift_only_in_the_second_step_stop_at_its_update_live_and_post_mortem(launcher, tmp_path):
    """Steps 0 and 1 (the Program's step index): the bias starts at zero, so rank 1's decay changes nothing in step
    0's update; step 1's differs. The recording of the run opens post-mortem with its steps and stops there too."""
    record = tmp_path / "decay.rwtrace"
    with Coordinator(str(DECAY), 2, entry="train_step", steps=2, timeout_s=120, launcher=launcher,
                     replicas=["bias"], record=str(record)) as live:
        stop = live.run()
        first = [live.tensor(r, "p_bias_updated")["bytes"] for r in range(2)]
        assert first[0] == first[1]  # step 0's update agrees
    with Coordinator(trace=str(record), timeout_s=120, launcher=launcher, replicas=["bias"]) as recorded:
        assert [c.number for c in recorded.collectives(1)] == list(range(1, 5))  # 2 parameters, 2 steps
        assert recorded.run().description == stop.description
    assert (stop.reason, stop.rank, stop.finding) == ("exception", 1, True)
    assert stop.description.startswith("replicas differ: 'p_bias' (p_bias_updated_step1) written by ")
    assert stop.exception["filter"] == "replicas" and stop.exception["value"] == "p_bias_updated_step1"


def test_a_hook_registered_twice_on_one_rank_is_caught_in_the_next_step_before_any_rank_blocks(launcher):
    """Rank 1 all-reduces its gradient twice a step, rank 0 once: rank 1's second of step 0 runs with rank 0's of
    step 1 (they match, as gloo would pair them), and rank 1's first of step 1 has no peer."""
    words = (f"rank 0 reaches the end of the program after 2 collective(s); rank 1 calls all_reduce #3 "
             f"(float32[2,4], sum) at hooked_twice.py:{line_of(TWICE, '# REDUCE')}")
    with Coordinator(str(TWICE), 2, entry="train_step", steps=2, timeout_s=120, launcher=launcher) as twice:
        stop = twice.run()
        assert (stop.reason, stop.finding, stop.description) == ("exception", True, words)
        states = twice.states()
        assert states[0]["tick"] == states[0]["end"] and states[1]["at_fence"]  # rank 1 before it, not in it
        assert twice.collectives(1)[2].node.endswith("_step1") and [s["calls"] for s in states.values()] == [2, 2]
        assert twice.run(Direction.REVERSE).reason == "entry"


@pytest.mark.parametrize("steps, words", [
    (0, "steps is the number of training steps, a whole number from 1 to 10000; got 0"),
    (True, "steps is the number of training steps, a whole number from 1 to 10000; got True"),
    ("3", "steps is the number of training steps, a whole number from 1 to 10000; got '3'"),
])
def test_a_number_of_steps_that_is_not_a_whole_number_from_1_is_refused_before_any_rank_starts(steps, words):
    with pytest.raises(RewindError, match=words):
        Coordinator(str(DATA_PARALLEL), 2, entry="train_step", steps=steps)


def test_steps_with_a_trace_of_ranks_are_refused_the_trace_holds_the_steps_it_recorded(tmp_path):
    with pytest.raises(RewindError, match="a trace of many ranks holds the training steps it recorded: open it "
                                          r"without steps \(got 2\)"):
        Coordinator(trace=str(tmp_path / "run.rwtrace"), steps=2)


def test_steps_of_an_entry_that_is_no_training_step_are_refused_by_every_rank(launcher):
    with pytest.raises(RewindError) as refused:
        Coordinator(str(MODELS / "ranks" / "skipped_collective.py"), 2, steps=2, launcher=launcher)
    said = str(refused.value)
    for r in range(2):
        assert f"rank {r}: steps counts training steps, and build() in " in said
    assert "launch a training step (entry 'train_step'" in said
