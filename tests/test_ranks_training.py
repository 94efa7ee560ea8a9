"""A data-parallel training step on many ranks (examples/data_parallel.py): each rank trains on its shard of the batch,
a gradient hook all-reduces each gradient, and the replicated parameters stay identical. One rank launcher and one
2-rank group serve the module; its ring is tiny, so values read back are recomputed."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from hardware.errors import RewindError
from hardware.frontends.torch_train import load_program
from hardware.ranks.coordinator import Coordinator
from hardware.session import LaunchOptions, Session
from hardware.ticks import Direction
from tests.conftest import EXAMPLES, fresh_module, line_of

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
DATA_PARALLEL = EXAMPLES / "data_parallel.py"


def _updated(path: str) -> str:
    """The Program value a step's update of the parameter at module path `path` writes."""
    return f"p_{path.replace('.', '_')}_updated"


@pytest.fixture(scope="module")
def two(launcher):
    with Coordinator(str(DATA_PARALLEL), 2, entry="train_step", budget_mb=0.0005, timeout_s=120,
                     launcher=launcher) as c:
        yield c


def test_the_gradient_all_reduce_is_a_collective_of_the_backward_at_the_hooks_line(two):
    hook_line = line_of(DATA_PARALLEL, 'funcol.all_reduce(grad, "sum"')
    for r in range(2):
        collectives = two.collectives(r)
        assert [c.op for c in collectives] == ["all_reduce"] * 4  # one per parameter
        assert {c.where for c in collectives} == {f"data_parallel.py:{hook_line}"}
        assert all(re.fullmatch(r"all_reduce(_\d+)?_backward", c.node) for c in collectives)  # backward nodes' names
        with pytest.raises(RewindError, match=f"rank {r}: 'loss' does not exist at tick 0"):
            two.tensor(r, "loss")  # the forward has not run: no loss yet
    try:
        for r in range(2):  # right before its first gradient all_reduce, the rank's loss is written: the backward
            two.goto(two.collectives(r)[0].tick, r)
            assert two.tensor(r, "loss")["shape"] == []
    finally:
        two.goto(0)


def test_a_data_parallel_step_trains_every_rank_as_one_process_trains_on_the_whole_batch(two):
    assert two.run().reason == "end"
    expected = fresh_module(DATA_PARALLEL).reference()
    for r in range(2):
        for path, want in expected.items():
            got = two.tensor(r, _updated(path))
            assert torch.allclose(torch.tensor(got["values"]).reshape(want.shape), want, atol=1e-6), (r, path)
    losses = [two.tensor(r, "loss")["values"] for r in range(2)]
    assert losses[0] != losses[1]  # each rank computed the loss of its own shard


def test_replicated_parameters_stay_bit_identical_on_every_rank_after_the_step(two):
    two.run()
    for path in fresh_module(DATA_PARALLEL).reference():
        got = [two.tensor(r, _updated(path))["bytes"] for r in range(2)]
        assert got[0] == got[1], path


def test_stepping_back_across_the_gradient_all_reduce_is_bit_identical(two):
    two.run()
    last = two.collectives(0)[-1]  # the last gradient all_reduce
    names = [last.value] + [_updated(path) for path in fresh_module(DATA_PARALLEL).reference()]
    before = {r: [two.tensor(r, n)["bytes"] for n in names] for r in range(2)}
    calls = {r: s["calls"] for r, s in two.states().items()}
    two.goto(last.tick - 1, 0)  # back across it
    assert all(s["passed"] == 3 for s in two.states().values())
    assert two.run(Direction.REVERSE).reason == "entry"  # back across every one, to the beginning
    assert two.run().reason == "end"  # and forward again: the recorded runs, no second all_reduce
    states = two.states()
    assert {r: [two.tensor(r, n)["bytes"] for n in names] for r in range(2)} == before
    assert {r: s["calls"] for r, s in states.items()} == calls
    assert all(s["replayed"] > 0 and s["recomputed"] > 0 for s in states.values())


def test_a_gradient_hook_of_one_process_runs_in_its_training_step_at_the_hooks_line(tmp_path):
    model = tmp_path / "hooked.py"
    model.write_text(textwrap.dedent('''\
        import torch
        from torch import nn


        def doubled(grad):
            return grad * 2  # HOOK


        def train_step():
            torch.manual_seed(0)
            m = nn.Linear(3, 2)
            m.weight.register_hook(doubled)
            return m, (torch.ones(4, 3), torch.zeros(4, 2)), nn.functional.mse_loss, torch.optim.SGD(m.parameters(), lr=0.1)
        '''))
    program = load_program(model, "train_step")
    hooked = [n for n in program.nodes if n.loc is not None and n.loc.line == line_of(model, "# HOOK")]
    assert [(n.op, n.phase, n.differentiates) for n in hooked] == [("aten.mul.Tensor", "backward", None)]
    session = Session(None)
    session.launch(LaunchOptions(str(model), entry="train_step", driver="torch:cpu"), program=program)
    session.run()
    torch.manual_seed(0)
    eager = torch.nn.Linear(3, 2)
    eager.weight.register_hook(lambda grad: grad * 2)
    torch.nn.functional.mse_loss(eager(torch.ones(4, 3)), torch.zeros(4, 2)).backward()
    assert torch.equal(session.tensor("grad_p_weight"), eager.weight.grad)
    session.close()
