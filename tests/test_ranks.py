"""Many ranks on torch.distributed (hardware/ranks/): real rank processes in one gloo process group, driven by the
coordinator. One rank launcher serves the module (it imports torch once and forks every launch's ranks), and one
group per model is started for the module."""

from __future__ import annotations

import time

import psutil
import pytest
import torch

from hardware.errors import RewindError
from hardware.frontends.cache_folder import CacheFolder
from hardware.ranks.coordinator import Coordinator
from hardware.ticks import Direction
from tests.conftest import EXAMPLES, MODELS, fresh_module, line_of

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
TENSOR_PARALLEL = EXAMPLES / "tensor_parallel.py"
RANKS = MODELS / "ranks"


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def four(launcher):
    """The tensor-parallel example on 4 ranks, with a ring so small that values are recomputed when read back."""
    with Coordinator(str(TENSOR_PARALLEL), 4, budget_mb=0.0005, timeout_s=120, launcher=launcher) as c:
        yield c


@pytest.fixture(scope="module")
def skipped(launcher):
    with Coordinator(str(RANKS / "skipped_collective.py"), 2, timeout_s=120, launcher=launcher) as c:
        yield c


def _bytes(c: Coordinator, name_of) -> dict[int, list[int]]:
    return {r: c.tensor(r, name_of(r))["bytes"] for r in range(c.world_size)}


def test_tensor_parallel_output_equals_one_process(four):
    stop = four.run()
    assert stop.reason == "end" and set(stop.ticks) == {0, 1, 2, 3}
    expected = fresh_module(TENSOR_PARALLEL).reference()
    for r in range(4):
        got = four.tensor(r, four.outputs(r)[0])
        assert got["shape"] == list(expected.shape)
        assert torch.allclose(torch.tensor(got["values"]).reshape(expected.shape), expected, atol=1e-5)


def test_every_motion_stops_at_a_consistent_cut(four):
    four.goto(0)
    seen = []
    for motion in [lambda: four.step(), lambda: four.step(kind="node")] * 6 + [
            lambda: four.step(Direction.REVERSE), lambda: four.run(Direction.REVERSE), lambda: four.run()]:
        motion()
        states = four.states()
        assert len({s["passed"] for s in states.values()}) == 1, states  # the same collectives run on every rank
        seen.append(states[0]["passed"])
    assert max(seen) == 2 and 0 in seen


def test_step_back_across_a_collective_is_bit_identical_on_every_rank(four):
    four.run()
    summed = {r: four.collectives(r)[1] for r in range(4)}  # the second all_reduce
    after = summed[0].tick + 1
    wait_of = lambda r: summed[r].value  # noqa: E731  (its result on rank r)
    four.goto(after, 0)
    before = _bytes(four, wait_of)
    calls = {r: s["calls"] for r, s in four.states().items()}
    four.goto(summed[0].tick - 1, 0)  # back across the collective
    assert all(s["passed"] == 1 for s in four.states().values())
    four.goto(after, 0)  # and forward again: the recorded run, not a second all_reduce
    assert _bytes(four, wait_of) == before
    states = four.states()
    assert {r: s["calls"] for r, s in states.items()} == calls
    assert all(s["recomputed"] > 0 for s in states.values())  # values evicted by the tiny ring were recomputed,
    assert all(s["replayed"] > 0 for s in states.values())  # a collective's from its recorded result
    assert len({bytes(b) for b in before.values()}) == 1  # an all_reduce leaves every rank the same sum


def test_a_skipped_collective_stops_every_rank_before_any_blocks(skipped):
    started = time.monotonic()
    stop = skipped.run()
    assert time.monotonic() - started < 60  # no deadlock: a hang would sit until the gloo timeout
    model = RANKS / "skipped_collective.py"
    assert stop.reason == "exception"
    assert (f"rank 0 calls all_reduce #2 (float32[4], sum) at skipped_collective.py:{line_of(model, '# SKIPPED')}"
            in stop.description)
    assert (f"rank 1 calls all_gather_into_tensor #2 (float32[4]) at "
            f"skipped_collective.py:{line_of(model, '# GATHER')}") in stop.description
    states = skipped.states()
    assert all(s["passed"] == 1 and s["at_fence"] for s in states.values())
    assert all(s["calls"] == 1 for s in states.values())  # neither ran its mismatched collective
    assert skipped.values(1)  # every rank alive and inspectable
    back = skipped.step(Direction.REVERSE)
    assert back.reason == "step" and all(s["passed"] == 1 for s in skipped.states().values())
    assert skipped.run(Direction.REVERSE).reason == "entry"


@pytest.mark.parametrize("ranks", [0, -1, 1000, True, "2"])
def test_a_number_of_ranks_that_is_none_is_refused(ranks):
    with pytest.raises(RewindError, match="ranks is the number of processes"):
        Coordinator(str(TENSOR_PARALLEL), ranks)


def test_a_rank_that_does_not_exist_is_refused_by_name(skipped):
    for bad in (2, -1, "one"):
        with pytest.raises(RewindError, match=r"no rank .*ranks 0\.\.1"):
            skipped.values(bad)
    with pytest.raises(RewindError, match="outside rank 0's program"):
        skipped.goto(10_000)


def _workers() -> set[int]:
    """The rank processes this test process has started and not yet seen end."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and "hardware.ranks.worker" in " ".join(p.cmdline())}


def test_a_build_that_fails_on_one_rank_names_it_and_leaves_no_process(launcher):
    before = _workers()
    with pytest.raises(RewindError, match="rank 1: calling build.*rank 1 has no shard to load"):
        Coordinator(str(RANKS / "fails_on_one_rank.py"), 2, launcher=launcher)
    assert _workers() <= before


def test_a_send_to_a_rank_the_session_does_not_have_is_refused_at_launch_in_words(launcher):
    model = RANKS / "point_to_point.py"
    send = line_of(model, "# SEND")
    with pytest.raises(RewindError, match=rf"^isend #1 \(float32\[4\] to rank 1\) at point_to_point.py:{send} sends "
                       r"to rank 1, and this session has ranks 0\.\.0$"):
        Coordinator(str(model), 1, launcher=launcher)


def test_a_rank_that_exits_says_so_and_leaves_no_process_not_even_its_own_launcher():
    before = _workers()
    gone = r"(?s)^rank 1 ended while loading its program \(exit code 3\).*rank 1 gives up"
    with pytest.raises(RewindError, match=gone):
        Coordinator(str(RANKS / "exits_on_one_rank.py"), 2)  # no launcher given: one of its own
    assert _workers() <= before


def test_closing_ends_every_rank_process(skipped):
    pids = skipped.pids()
    assert all(psutil.pid_exists(p) for p in pids)
    skipped.close()
    assert _gone(pids)


class _ClientGone(Exception):
    """What a surface's own on_notes raises when the client it tells has gone."""


def test_closing_ends_every_rank_even_when_hearing_a_rank_finish_its_recording_fails(launcher, tmp_path):
    closing: list[bool] = []

    def on_notes(rank: int, notes: list[str]) -> None:
        if closing:
            raise _ClientGone(f"no client to hear rank {rank}")

    c = Coordinator(str(TENSOR_PARALLEL), 2, timeout_s=120, launcher=launcher, on_notes=on_notes,
                    record=str(tmp_path / "run.rwtrace"))
    pids = c.pids()
    (tmp_path / "run.rank1.rwtrace").write_text("the user's")  # made since: rank 1 cannot place its trace, and says so
    closing.append(True)
    with pytest.raises(_ClientGone):
        c.close()
    assert _gone(pids)  # every rank ended all the same
    assert (tmp_path / "run.rank1.rwtrace").read_text() == "the user's" and not (tmp_path / "run.rwtrace").exists()
    c.close()  # closed once: nothing more to do


def test_a_rank_that_stops_making_progress_is_reported_with_every_position(launcher):
    model = RANKS / "slow_rank.py"
    with Coordinator(str(model), 2, timeout_s=2, launcher=launcher) as c:
        stop = c.run()
        assert stop.reason == "exception" and stop.rank == 1
        assert stop.description.startswith("rank 1 did not return within 2 s while running continue, from tick 0")
        reduce = c.collectives(0)[0]
        assert (f"rank 0 is at tick {reduce.tick} (before all_reduce #1 (float32[2,4], sum) at "
                f"slow_rank.py:{line_of(model, '# REDUCE')})") in stop.description
        assert c.values(0)  # the ranks that answered stay inspectable
        with pytest.raises(RewindError, match="rank 1 is still busy running continue"):
            c.values(1)


RANK_BRANCH = '''"""forward branches on the rank it runs on: rank 1's graph multiplies where rank 0's adds."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


class Branch(nn.Module):
    def forward(self, x):
        y = x * 3.0 if dist.get_rank() == 1 else x + 1.0
        return funcol.all_reduce(y, "sum", dist.group.WORLD)


def build(rank, world_size):
    return Branch(), (torch.ones(4),)
'''


def test_each_rank_caches_its_own_program_and_the_next_launch_loads_each_ranks_own(launcher, tmp_path):
    """The program cache's key holds the rank: a branch on dist.get_rank() inside forward makes one entry a rank,
    and a second launch loads them (the same files, not exported again), each rank its own graph."""
    model = tmp_path / "rank_branch.py"
    model.write_text(RANK_BRANCH)
    folder = CacheFolder.beside(model)
    files = []
    for _ in range(2):
        with Coordinator(str(model), 2, timeout_s=120, launcher=launcher) as c:
            assert c.run().reason == "end"
            assert [c.tensor(r, c.outputs(r)[0])["values"] for r in range(2)] == [[5.0] * 4] * 2  # (1 + 1) + 1 * 3
        files.append(sorted((e.path.name, e.path.stat().st_ino) for e in folder.entries(model)))
    assert len(files[0]) == 2 and files[1] == files[0]
