"""What the ranks leave the client, through the wire (docs/protocol.md, "Many ranks"): the lines each rank's program
prints arrive as `stdout` output events under its rank, and a recording whose rank was killed mid-session keeps
what that rank recorded under an index that opens post-mortem. One real server for the module; its rank processes
are killed as a device fault would kill them."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.dap.processes import engines
from tests.dap.wire import MODELS, Debugger, rank_ticks

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
PRINTS = MODELS / "ranks" / "prints_on_each_rank.py"
RECORDED = {"ranks": 2, "stopOnEntry": True, "checkpoint": {"budgetMB": 0.0005}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ranks-output")


@pytest.fixture(scope="module")
def server(schema):
    debugger = Debugger.spawn(schema)
    yield debugger
    debugger.close()


@pytest.fixture(scope="module")
def launched(server, folder) -> list[tuple[str, dict]]:
    """The model launched on 2 ranks, recorded to run.rwtrace: the events of its launch."""
    mark = server.client.mark()
    assert server.start(PRINTS, record=str(folder / "run.rwtrace"), **RECORDED)["reason"] == "entry"
    return server.client.events_since(mark)


def _said(events: list[tuple[str, dict]], category: str) -> str:
    return "".join(body["output"] for name, body in events if name == "output" and body.get("category") == category)


def _kill_rank(server: Debugger, rank: int) -> None:
    """SIGKILL the server's rank process `rank` (the one whose output goes to its rank{rank}.log), and wait until it
    is gone."""
    below = [psutil.Process(server.client.process.pid), *(psutil.Process(e) for e in engines(server.client.process.pid))]
    for process in (p for top in below for p in top.children(recursive=True)):
        try:
            if os.readlink(f"/proc/{process.pid}/fd/1").endswith(f"/rank{rank}.log"):
                process.send_signal(signal.SIGKILL)
                process.wait(10)
                return
        except (OSError, psutil.NoSuchProcess):
            continue
    raise AssertionError(f"no process of rank {rank}")


def _values(server: Debugger) -> dict[int, dict[str, str]]:
    """Every live value of each rank at the cut, each element exactly."""
    seen = {}
    for thread in (1, 2):
        frame = server.request("stackTrace", {"threadId": thread})["stackFrames"][0]["id"]
        seen[thread - 1] = {v["name"]: server.evaluate(f"${v['name']}.tolist()", frame_id=frame)["result"]
                            for v in server.scope("Live values", frame_id=frame)}
    return seen


def test_what_each_rank_prints_reaches_the_client_as_stdout_under_its_rank(launched):
    printed = _said(launched, "stdout").splitlines()
    for r in (0, 1):
        mine = [line for line in printed if line.startswith(f"[rank {r}] ")]
        assert mine == [f"[rank {r}] {line}" for line in (f"loading shard {r} of 2", f"weights: {r + 1} × 4 ✓",
                                                           "raw \ufffd\ufffd")]
    assert len(printed) == 6  # every line under its rank, once; what a rank says on stderr stays in its log
    assert "warns on stderr" not in "".join(body.get("output", "") for _, body in launched)


def test_a_rank_killed_while_recording_leaves_what_it_recorded_to_open_post_mortem(server, folder, launched):
    server.motion("next", {"threadId": 1})  # both ranks wait at the all_reduce
    stop = server.motion("next", {"threadId": 1})  # and cross it together
    cut, live = rank_ticks(stop), _values(server)
    _kill_rank(server, 1)
    stop = server.motion("next", {"threadId": 1})
    assert stop["reason"] == "exception" and "rank 1 ended while running next (exit code -9)" in stop["description"]
    mark = server.client.mark()
    index = folder / "run.rwtrace"
    assert server.motion("restart", {"arguments": {"trace": str(index), **RECORDED}})["reason"] == "entry"
    said = _said(server.client.events_since(mark), "important")
    assert (f"rank 1 ended before finishing its trace: what it recorded is kept in {folder / 'run.rank1.rwtrace'}"
            in said)
    assert sorted(p.name for p in folder.iterdir()) == ["run.rank0.rwtrace", "run.rank1.rwtrace", "run.rwtrace"]
    assert server.request("threads")["threads"] == [{"id": 1, "name": "rank 0"}, {"id": 2, "name": "rank 1"}]
    server.motion("next", {"threadId": 1})
    stop = server.motion("next", {"threadId": 1})
    assert rank_ticks(stop) == cut and _values(server) == live  # across the collective, as recorded, bit for bit


def test_a_killed_ranks_recording_that_cannot_be_kept_is_named_and_no_index_is_written(server, tmp_path):
    relaunch = {"program": str(PRINTS), "driver": "torch:cpu", **RECORDED}
    assert server.motion("restart", {"arguments": {**relaunch, "record": str(tmp_path / "run.rwtrace")}})["reason"] \
        == "entry"
    server.motion("next", {"threadId": 1})
    _kill_rank(server, 1)  # unnoticed until the session ends: no request reached the rank since
    (partial,) = tmp_path.glob(".run.rank1.rwtrace.*.partial")
    partial.unlink()  # what it recorded is lost (a disk cleaned up under it)
    mark = server.client.mark()
    assert server.motion("restart", {"arguments": relaunch})["reason"] == "entry"
    said = _said(server.client.events_since(mark), "important")
    assert (f"the index of the ranks' traces was not written at {tmp_path / 'run.rwtrace'}: rank 1 ended before "
            "finishing its trace run.rank1.rwtrace, and what it recorded could not be kept: it left no recording"
            in said)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rank0.rwtrace"]  # rank 0's trace, and no index
