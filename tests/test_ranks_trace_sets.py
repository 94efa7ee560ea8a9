"""A set of ranks' traces is one thing (docs/ranks.md, "Traces of many ranks"): traces that end at different places
never let one rank into a collective its peer only reads from its trace; a save that fails on one rank leaves the set
it was to replace as it was; and a rank killed while recording to a long path has its own recording adopted, not a
peer's (a temporary's name keeps only the start of its target's). Real rank processes in one gloo group."""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal

import psutil
import pytest

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from hardware.ranks.traces import rank_file, read_index, write_index
from tests.conftest import EXAMPLES, line_of

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
TENSOR_PARALLEL = EXAMPLES / "tensor_parallel.py"
REDUCE = line_of(TENSOR_PARALLEL, "funcol.all_reduce(")


def _digests(index) -> dict[str, str]:
    files = [index] + [rank_file(index, r) for r in range(2)]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_traces_that_end_at_different_places_stop_before_a_collective_one_rank_would_run_alone(launcher, tmp_path):
    whole, short = tmp_path / "whole" / "run.rwtrace", tmp_path / "short" / "run.rwtrace"
    for index in (whole, short):
        index.parent.mkdir()
        with Coordinator(str(TENSOR_PARALLEL), 2, timeout_s=60, launcher=launcher, record=str(index)) as c:
            if index == whole:
                c.run()
    mixed = tmp_path / "mixed" / "run.rwtrace"
    mixed.parent.mkdir()
    shutil.copy(rank_file(whole, 0), rank_file(mixed, 0))  # rank 0 ran to the end, rank 1 stopped at entry
    shutil.copy(rank_file(short, 1), rank_file(mixed, 1))
    opened = read_index(str(whole))
    write_index(mixed, False, opened.program, opened.entry, [list(r.collectives) for r in opened.ranks],
                opened.groups)
    with Coordinator(trace=str(mixed), timeout_s=60, launcher=launcher) as c:
        stop = c.run()
        assert (stop.reason, stop.rank, stop.finding) == ("exception", 1, True)
        assert stop.description == (
            f"rank 1's trace ends before all_reduce #1 (float32[4,8], sum) at tensor_parallel.py:{REDUCE}, which rank "
            f"0's trace holds (all_reduce #1 (float32[4,8], sum) at tensor_parallel.py:{REDUCE}): past the end of a "
            "recording a collective runs only where every rank taking part runs it, and rank 0 would read its result "
            "from its trace (this index's traces end at different places)")
        assert [s["calls"] for s in c.states().values()] == [0, 0]  # nobody entered gloo


def test_a_save_that_fails_on_one_rank_leaves_the_set_it_would_replace_as_it_was(launcher, tmp_path):
    index = tmp_path / "run.rwtrace"
    with Coordinator(str(TENSOR_PARALLEL), 2, timeout_s=60, launcher=launcher) as c:
        c.run()
        c.save_traces(str(index))
        before = _digests(index)
        c.goto(0)
        resource.prlimit(c.pids()[1], resource.RLIMIT_FSIZE, (200, 200))  # rank 1 can write no trace now
        with pytest.raises(RewindError, match="rank 1"):
            c.save_traces(str(index), overwrite=True)
    assert _digests(index) == before and read_index(str(index)).world_size == 2
    assert sorted(os.listdir(tmp_path)) == ["run.rank0.rwtrace", "run.rank1.rwtrace", "run.rwtrace"]  # no temporary


def test_a_rank_killed_while_recording_to_a_long_path_has_its_own_recording_adopted(launcher, tmp_path):
    index = tmp_path / ("r" * 200 + ".rwtrace")  # rank files agree in far more than a temporary's name keeps
    with Coordinator(str(TENSOR_PARALLEL), 2, timeout_s=60, launcher=launcher, record=str(index)) as c:
        c.run()
        os.kill(c.pids()[1], signal.SIGKILL)
        psutil.wait_procs([psutil.Process(c.pids()[1])], timeout=10)
    traced = read_index(str(index))
    assert [t.path.name for t in traced.ranks] == [rank_file(index, r).name for r in range(2)]
    with Coordinator(trace=str(index), timeout_s=60, launcher=launcher) as opened:
        assert opened.run().reason == "end"
