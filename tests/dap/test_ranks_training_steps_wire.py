"""Many training steps on many ranks through the wire (docs/ranks.md, "Data-parallel training"): a real server whose
session runs examples/data_parallel.py's training step 3 times on 2 real rank processes. One launch for the module,
with a ring so small that values read back are recomputed."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import EXAMPLES, fresh_module
from tests.dap.wire import Debugger, rank_ticks, refused

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
DATA_PARALLEL = EXAMPLES / "data_parallel.py"
LAUNCH = {"entry": "train_step", "steps": 3, "ranks": 2, "replicas": ["up.weight", "down.bias"],
          "stopOnEntry": True, "checkpoint": {"budgetMB": 0.0005}}


@pytest.fixture(scope="module")
def trainer(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(DATA_PARALLEL, **LAUNCH)["reason"] == "entry"
    yield debugger
    debugger.close()


def _frame(debugger: Debugger, thread: int) -> int:
    return debugger.request("stackTrace", {"threadId": thread})["stackFrames"][0]["id"]


def _down_bias(debugger: Debugger, name: str) -> list[list[float]]:
    """Each rank's value of `name` (a down.bias, 4 numbers), read through evaluate on its own frame."""
    return [[float(debugger.evaluate(f"{name}[{i}]", frame_id=_frame(debugger, t))["result"].rsplit("=", 1)[-1])
             for i in range(4)] for t in (1, 2)]


def test_each_ranks_timeline_has_the_three_steps_at_the_same_ticks(trainer):
    steps = [trainer.request("timeline", {"count": 0, "threadId": t})["steps"] for t in (1, 2)]
    assert [s["loss"] for s in steps[0]] == ["loss", "loss_step1", "loss_step2"]
    assert steps[0] == steps[1] and steps[0][0]["tick"] == 0 < steps[0][1]["tick"] < steps[0][2]["tick"]


def test_three_steps_train_every_rank_as_three_steps_of_one_process_and_step_back_to_the_same_values(trainer):
    stop = trainer.motion("continue", {"threadId": 1})  # the replicas compared after every step: they agree
    end = trainer.request("timeline", {"count": 0, "threadId": 1})["end"]
    assert (stop["reason"], rank_ticks(stop)) == ("end", [end, end])
    final = _down_bias(trainer, "p_down_bias_updated_step2")
    want = fresh_module(DATA_PARALLEL).reference(3)["down.bias"]
    assert final[0] == final[1] and torch.allclose(torch.tensor(final[0]), want, atol=1e-6)
    first = _down_bias(trainer, "p_down_bias_updated")
    assert trainer.motion("reverseContinue", {"threadId": 2})["reason"] == "entry"  # back across every step
    assert trainer.motion("continue", {"threadId": 1})["description"] == stop["description"]
    assert _down_bias(trainer, "p_down_bias_updated_step2") == final
    assert _down_bias(trainer, "p_down_bias_updated") == first


def test_steps_below_one_are_refused_in_words(trainer):
    refused(trainer, "restart", {"arguments": {"program": str(DATA_PARALLEL), **LAUNCH, "steps": 0}},
            "field 'arguments.steps': input should be greater than or equal to 1, got 0")
