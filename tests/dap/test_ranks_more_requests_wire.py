"""gotoStep, restoreCheckpoint and saveTrace with ranks through the wire (docs/ranks.md, "A step, a checkpoint, a
saved trace"): a real server whose session runs examples/data_parallel.py's training step twice on 2 real rank
processes, then the index saveTrace wrote opened post-mortem, and the planted skipped collective with a checkpoint
at every tick. One server for the module, relaunched only when a test needs another launch."""

from __future__ import annotations

import base64
import os

import pytest

from tests.conftest import EXAMPLES, MODELS
from tests.dap.wire import Debugger, Server, rank_ticks, refused

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
DATA_PARALLEL = EXAMPLES / "data_parallel.py"
SKIPS = MODELS / "ranks" / "skipped_collective.py"
TRAINING = {"program": str(DATA_PARALLEL), "driver": "torch:cpu", "entry": "train_step", "steps": 2, "ranks": 2,
            "stopOnEntry": True}
SKIPPING = {"program": str(SKIPS), "driver": "torch:cpu", "ranks": 2, "stopOnEntry": True}
ALL_REDUCE = "_c10d_functional.all_reduce.default"
UPDATED = ("p_up_weight_updated_step1", "p_down_bias_updated_step1", "loss_step1")  # the second step's


@pytest.fixture(scope="module")
def server(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(DATA_PARALLEL, **{k: v for k, v in TRAINING.items() if k != "program"})["reason"] == "entry"
    yield Server(debugger, TRAINING)
    debugger.close()


@pytest.fixture
def trainer(server: Server) -> Debugger:
    return server.launch(TRAINING)


def _frame(debugger: Debugger, thread: int) -> dict:
    return debugger.request("stackTrace", {"threadId": thread})["stackFrames"][0]


def _all_reduces(debugger: Debugger, thread: int) -> list[int]:
    """The ticks of the thread's rank's all_reduces (timeline: every node of its Program, run or not)."""
    ticks = debugger.request("timeline", {"start": 0, "count": 1000, "threadId": thread})["ticks"]
    return [t["tick"] for t in ticks if t["op"] == ALL_REDUCE]


def _passed(debugger: Debugger, thread: int) -> tuple[int, int]:
    """The thread's rank's position, and how many all_reduces it has run (its nodes before its position)."""
    position = debugger.request("timeline", {"count": 0, "threadId": thread})["position"]
    return position, sum(1 for tick in _all_reduces(debugger, thread) if tick < position)


def _bytes(debugger: Debugger, thread: int, name: str) -> bytes:
    """A value of the thread's rank, bit for bit (readMemory of its storage, as many bytes as locate says it has)."""
    frame = _frame(debugger, thread)["id"]
    reference = debugger.evaluate(name, frame_id=frame)["memoryReference"]
    count = sum(s["nbytes"] for s in debugger.request("locate", {"name": name, "frameId": frame})["shards"])
    return base64.b64decode(debugger.request("readMemory", {"memoryReference": reference, "count": count})["data"])


# -- gotoStep ------------------------------------------------------------------------------------------------------
def test_goto_step_puts_the_threads_rank_at_the_steps_first_tick_and_the_other_at_a_consistent_cut(trainer):
    second = trainer.request("timeline", {"count": 0, "threadId": 2})["steps"][1]["tick"]
    stop = trainer.motion("gotoStep", {"step": 1, "threadId": 2})
    assert (stop["reason"], stop["threadId"]) == ("goto", 2)
    assert stop["description"].startswith(f"rank 1: start of step 1 (step 1, tick {second})")
    assert rank_ticks(stop)[1] == second and _passed(trainer, 2) == (second, 4)  # step 0's 4 gradients summed
    assert _passed(trainer, 1)[1] == 4  # rank 0 ran the same all_reduces with it, and no more
    assert trainer.motion("continue", {"threadId": 1})["reason"] == "end"
    stop = trainer.motion("gotoStep", {"step": 1})  # no thread: the rank the last stop is about (rank 0)
    assert (stop["threadId"], _passed(trainer, 1), _passed(trainer, 2)[1]) == (1, (second, 4), 4)  # back across 4
    stop = trainer.motion("gotoStep", {"step": 0, "threadId": 2})  # back across step 0's: rank 0 with it, no further
    assert (stop["reason"], rank_ticks(stop)) == ("goto", [_all_reduces(trainer, 1)[0], 0])


@pytest.mark.parametrize("arguments, words", [
    ({"step": 2, "threadId": 2}, "rank 1: step 2 is not a step of this run: its steps are 0..1"),
    ({"step": -1}, "rank 0: step -1 is not a step of this run"),
    ({"step": "1"}, "field 'step': input should be a valid integer"),
    ({"step": 1, "threadId": 3}, "no thread 3")])
def test_a_step_the_run_does_not_have_is_refused_naming_the_rank_and_nothing_moves(trainer, arguments, words):
    refused(trainer, "gotoStep", arguments, words)
    assert [_passed(trainer, thread) for thread in (1, 2)] == [(0, 0), (0, 0)]  # every rank still on entry


# -- saveTrace -----------------------------------------------------------------------------------------------------
def test_save_trace_writes_each_ranks_trace_beside_the_index_which_opens_post_mortem_bit_identical(server, tmp_path):
    trainer = server.launch(TRAINING)
    assert trainer.motion("continue", {"threadId": 1})["reason"] == "end"
    live = {thread: {name: _bytes(trainer, thread, name) for name in UPDATED} for thread in (1, 2)}
    index = tmp_path / "run.rwtrace"
    saved = trainer.request("saveTrace", {"path": str(index)})
    assert (saved["path"], saved["bytes"]) == (str(index), index.stat().st_size)
    assert [(r["rank"], r["path"], r["bytes"]) for r in saved["ranks"]] == [
        (r, str(tmp_path / f"run.rank{r}.rwtrace"), (tmp_path / f"run.rank{r}.rwtrace").stat().st_size)
        for r in (0, 1)]
    assert sorted(os.listdir(tmp_path)) == ["run.rank0.rwtrace", "run.rank1.rwtrace", "run.rwtrace"]
    traced = server.launch({"trace": str(index), "stopOnEntry": True})
    assert traced.motion("continue", {"threadId": 2})["reason"] == "end"
    assert {thread: {name: _bytes(traced, thread, name) for name in UPDATED} for thread in (1, 2)} == live
    assert [live[1][name] == live[2][name] for name in UPDATED] == [True, True, False]  # replicas; each own loss
    assert traced.motion("gotoStep", {"step": 1, "threadId": 1})["description"].startswith(
        "rank 0: start of step 1")  # the steps are in the traces


def test_save_trace_destroys_nothing_and_refuses_bad_paths_in_words(trainer, tmp_path):
    index = tmp_path / "run.rwtrace"
    trainer.request("saveTrace", {"path": str(index)})
    first = {p: p.read_bytes() for p in tmp_path.iterdir()}
    refused(trainer, "saveTrace", {"path": str(index)}, f"saveTrace: {index} exists; send overwrite: true")
    index.unlink()  # a rank's file still there is refused by name, before any rank writes
    refused(trainer, "saveTrace", {"path": str(index)}, f"saveTrace: {tmp_path / 'run.rank0.rwtrace'} exists")
    assert not index.exists()
    (tmp_path / "other.rank1.rwtrace").mkdir()
    refused(trainer, "saveTrace", {"path": str(tmp_path / "other.rwtrace")},
            f"{tmp_path / 'other.rank1.rwtrace'}: it is a folder, not a regular file")
    assert not (tmp_path / "other.rank0.rwtrace").exists()  # rank 0 wrote nothing
    refused(trainer, "saveTrace", {"path": str(tmp_path)}, "it is a folder, not a regular file")
    refused(trainer, "saveTrace", {"path": f"{tmp_path}/x\0.rwtrace"}, "the path contains a NUL character")
    refused(trainer, "saveTrace", {"path": str(DATA_PARALLEL)}, "it is the program being debugged")
    refused(trainer, "saveTrace", {"path": str(tmp_path / "no" / "x.rwtrace")},
            f"cannot write {tmp_path / 'no' / 'x.rwtrace'}: the folder {tmp_path / 'no'} does not exist")
    saved = trainer.request("saveTrace", {"path": str(index), "overwrite": True})
    assert saved["path"] == str(index)  # replaced, with the same run: the same bytes
    assert [p.read_bytes() for p in first] == list(first.values())


# -- restoreCheckpoint -----------------------------------------------------------------------------------------------
def test_restore_checkpoint_puts_the_threads_rank_at_its_checkpoint_and_the_other_at_a_consistent_cut(server):
    skips = server.launch(SKIPPING)
    mismatch = skips.motion("continue", {"threadId": 1})  # both ran all_reduce #1, stop at #2's mismatch
    summed = _bytes(skips, 2, "all_reduce")  # rank 1's all_reduce #1, read where it stopped
    reduce, position = _all_reduces(skips, 2)[0], [_passed(skips, t)[0] for t in (1, 2)]
    checkpoints = [c["tick"] for c in skips.request("checkpoints", {"threadId": 2})["checkpoints"]]
    before, after = [t for t in checkpoints if t <= reduce], [t for t in checkpoints if reduce < t <= position[1]]
    stop = skips.motion("restoreCheckpoint", {"tick": after[-1], "threadId": 2})
    assert (stop["reason"], stop["threadId"]) == ("goto", 2)
    assert stop["description"].startswith(f"rank 1: restored its checkpoint at tick {after[-1]}")
    assert rank_ticks(stop) == [position[0], after[-1]]  # nothing to cross: rank 0 stays
    assert _bytes(skips, 2, "all_reduce") == summed
    stop = skips.motion("restoreCheckpoint", {"tick": before[-1]})  # no thread: the last stop's rank, rank 1
    assert (stop["threadId"], rank_ticks(stop)) == (2, [_all_reduces(skips, 1)[0], before[-1]])  # #1 back with it
    assert skips.motion("continue", {"threadId": 1})["description"] == mismatch["description"]
    assert _bytes(skips, 2, "all_reduce") == summed  # the recorded all_reduce, again
    missing = next(t for t in range(position[1] + 1) if t not in checkpoints)
    refused(skips, "restoreCheckpoint", {"tick": missing, "threadId": 2},
            f"rank 1 has no checkpoint at tick {missing}; its checkpoints: {checkpoints}")
    refused(skips, "restoreCheckpoint", {"tick": 0, "threadId": 3}, "no thread 3")
    refused(skips, "restoreCheckpoint", {"tick": "0"}, "field 'tick': input should be a valid integer")
    refused(skips, "restoreCheckpoint", {"tik": 0}, "unknown field 'tik'")
