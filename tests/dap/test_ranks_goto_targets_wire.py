"""Through the wire, on the pipeline example with 2 ranks (rank 1 alone runs the irecv line, rank 0 alone the isend
line): `gotoTargets` lists the ticks of the rank its `threadId` names (Rewind's addition to the standard request),
so a `goto` on that thread moves that rank; without ranks the thread is only checked. And the launch's `checkpoint`
settings reach every rank's ring: `every` spaces each rank's own checkpoints. One server for the module, launched
with `"checkpoint": {"every": 2}` (each rank's default spacing, √nodes, is 4), relaunched once on a model of one
process."""

from __future__ import annotations

import pytest

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from tests.conftest import EXAMPLES, line_of
from tests.dap.wire import Debugger, Server, rank_ticks, refused

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
PIPELINE = EXAMPLES / "pipeline_parallel.py"
RECV, STAGE = (line_of(PIPELINE, text) for text in ("# RECV", "h = torch.tanh(F.linear(h, self.weight))"))
EVERY = 2
PIPELINE_LAUNCH = {"program": str(PIPELINE), "driver": "torch:cpu", "ranks": 2, "stopOnEntry": True,
                   "checkpoint": {"every": EVERY}}


@pytest.fixture(scope="module")
def server(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(PIPELINE, stopOnEntry=True, ranks=2, checkpoint={"every": EVERY})["reason"] == "entry"
    yield Server(debugger, PIPELINE_LAUNCH)
    debugger.close()


@pytest.fixture
def pipeline(server: Server) -> Debugger:
    return server.launch(PIPELINE_LAUNCH)


def _targets(debugger: Debugger, line: int, **thread: int) -> list[dict]:
    arguments = {"source": {"path": str(PIPELINE)}, "line": line, **thread}
    return debugger.request("gotoTargets", arguments)["targets"]


def test_goto_targets_of_rank_1s_thread_list_its_ticks_and_a_goto_on_it_moves_rank_1_there(pipeline):
    of_rank_1 = _targets(pipeline, RECV, threadId=2)  # its irecv line runs once per micro-batch, on rank 1 only
    assert [t["line"] for t in of_rank_1] == [RECV, RECV], of_rank_1
    assert [t["label"].split(":")[1].split()[0] for t in of_rank_1] == ["zeros", "zeros_1"]  # the recv's template
    # the entry's stop is about rank 0, where no node runs on that line: it answers for the line after, as before
    assert [t["line"] for t in _targets(pipeline, RECV)] == [STAGE, STAGE] == \
        [t["line"] for t in _targets(pipeline, RECV, threadId=1)]
    second = of_rank_1[1]
    stop = pipeline.motion("goto", {"threadId": 2, "targetId": second["id"]})
    assert (stop["reason"], stop["threadId"]) == ("goto", 2), stop
    assert rank_ticks(stop)[1] == second["id"] - 1 and stop["description"].startswith(f"rank 1 at tick "
                                                                                      f"{second['id'] - 1}"), stop
    top = pipeline.request("stackTrace", {"threadId": 2})["stackFrames"][0]
    assert (top["line"], top["name"].split()[0]) == (RECV, "zeros_1"), top


def test_goto_targets_refuses_a_thread_that_is_no_rank_in_words(pipeline):
    refused(pipeline, "gotoTargets", {"source": {"path": str(PIPELINE)}, "line": RECV, "threadId": 3},
            "no thread 3: this program's threads are 1..2")
    refused(pipeline, "gotoTargets", {"source": {"path": str(PIPELINE)}, "line": RECV, "threadId": "rank 1"},
            "threadId")


def test_every_ranks_checkpoints_follow_the_launchs_every(pipeline):
    assert pipeline.motion("continue", {"threadId": 1})["reason"] == "end"
    for thread in (1, 2):
        end = pipeline.request("timeline", {"count": 0, "threadId": thread})["end"]
        ticks = [c["tick"] for c in pipeline.request("checkpoints", {"threadId": thread})["checkpoints"]]
        assert ticks == list(range(0, end, EVERY)), (thread, end, ticks)


def test_a_coordinator_refuses_ring_settings_a_session_does_not_have():
    with pytest.raises(RewindError, match=r"ring is a dict of the checkpoint ring's settings \(every, .*'evry'"):
        Coordinator(str(PIPELINE), 2, ring={"evry": 2})


def test_without_ranks_goto_targets_only_checks_its_thread(server: Server):
    single = server.launch({"program": str(EXAMPLES / "mlp.py"), "driver": "torch:cpu", "stopOnEntry": True})
    mlp = EXAMPLES / "mlp.py"
    line = single.request("stackTrace", {"threadId": 1})["stackFrames"][0]["line"]
    asked = {"source": {"path": str(mlp)}, "line": line}
    targets = single.request("gotoTargets", asked)["targets"]
    assert targets and single.request("gotoTargets", {**asked, "threadId": 1})["targets"] == targets
    refused(single, "gotoTargets", {**asked, "threadId": 7}, "no thread 7: this program's threads are 1..1")
