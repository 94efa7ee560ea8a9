"""Training steps as people write them: a loss built with one_hot, a loss that closes over its target, a file with
only train_step(), dropout and randn_like in train mode (the same numbers as eager torch with the same seed, stepping
back and forth bit for bit), and every step Rewind cannot trace told with the user's line, in words."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest
import torch

from hardware.errors import ProgramLoadError
from hardware.events import Output
from hardware.frontends.torch_export import user_file
from hardware.frontends.torch_train import load_program
from hardware.session import Direction, LaunchOptions, Session
from provenance import forensics_cli
from tests import test_training_program
from tests.conftest import MODELS, line_of

TRAINING = MODELS / "training"
ONE_HOT = TRAINING / "one_hot_loss.py"  # label smoothing written with one_hot(target, logits.shape[-1]); AdamW
CLOSURE = TRAINING / "closure_loss.py"  # `lambda out: mse_loss(out, y)`, and no build()
DROPOUT = TRAINING / "dropout_noise.py"  # nn.Dropout, F.dropout and randn_like in train mode; SGD with momentum
STEPS = 3


ran = test_training_program.ran  # each file's training Program, run to its end (shared: one trace per file)
training = test_training_program.training


def eager_steps(path: Path, closure: bool = False, seen: torch.nn.Module | None = None):
    """The file's training loop in eager torch, run right after train_step() as a script would: each step's loss,
    its parameters after the update, and (with `seen`, a path of a submodule) what that submodule returned."""
    with user_file(path) as module:
        model, inputs, loss_fn, optimizer = module.train_step()
        batches = list(itertools.islice(module.batches(), STEPS)) if hasattr(module, "batches") else [inputs] * STEPS
    outputs: list[torch.Tensor] = []
    if seen is not None:
        model.get_submodule(seen).register_forward_hook(lambda _m, _i, out: outputs.append(out.detach().clone()))
    steps = []
    for batch in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(*batch)) if closure else loss_fn(model(*batch[:-1]), batch[-1])
        loss.backward()
        optimizer.step()
        steps.append((loss.detach(), {n: p.detach().clone() for n, p in model.named_parameters()}))
    return steps, outputs


def assert_trains_as_eager(path: Path, closure: bool = False) -> None:
    session, program = ran(path), training(path)
    steps, _ = eager_steps(path, closure)
    for k, (loss, params) in enumerate(steps):
        torch.testing.assert_close(session.tensor(program.losses[k]), loss, rtol=1e-6, atol=1e-8)
        for name, param in params.items():
            updated = f"p_{name.replace('.', '_')}_updated" + (f"_step{k}" if k else "")
            torch.testing.assert_close(session.tensor(updated), param, rtol=1e-6, atol=1e-8)


# -- one_hot, a closure, a file of train_step() alone -------------------------------------------------------------

def test_a_loss_built_with_one_hot_traces_and_trains_as_eager_torch_does():
    program = training(ONE_HOT)
    line = line_of(ONE_HOT, "F.one_hot(target")
    assert any(n.loc is not None and n.loc.line == line and n.phase == "forward" for n in program.nodes)
    assert_trains_as_eager(ONE_HOT)


def test_a_loss_of_the_output_alone_that_closes_over_its_target_trains_as_eager_torch_does():
    program = training(CLOSURE)
    assert [n for n, v in program.values.items() if v.kind == "input"] == ["input"]  # no target among the inputs
    assert_trains_as_eager(CLOSURE, closure=True)


def test_a_file_that_defines_only_train_step_launches_its_training_step_and_says_so_once():
    said: list[str] = []
    session = Session(lambda event: said.append(event.text) if isinstance(event, Output) else None)
    session.launch(LaunchOptions(str(CLOSURE), driver="torch:cpu"))  # the default entry, build, is not there
    assert session.program.step_starts == [0] and session.program.losses == ["loss"]
    assert [t for t in said if "train_step" in t] == ["closure_loss.py defines train_step() and no build(): running "
                                                       "its training step (entry train_step)\n"]
    session.close()


def test_rewind_forensics_runs_a_file_of_train_step_alone_and_says_which_entry(capsys):
    status = forensics_cli.main([str(CLOSURE), "--driver", "torch:cpu", "--budget-mb", "64", "--no-ablate"])
    out, err = capsys.readouterr()
    assert status == 0, out + err
    assert "closure_loss.py defines train_step() and no build(): running its training step" in err
    assert "Traceback" not in out + err


# -- random numbers: the generator's state is a value of the Program ---------------------------------------------

def test_dropout_and_randn_like_draw_what_eager_torch_draws_with_the_same_seed():
    session, program = ran(DROPOUT), training(DROPOUT)
    _, dropped = eager_steps(DROPOUT, seen="drop")
    module_dropout = [n for n in program.nodes if n.op == "rewind.seeded_native_dropout.default"
                      and n.module_stack and n.module_stack[-1][0] == "drop"]
    assert [n.step for n in module_dropout] == list(range(STEPS))
    for node, eager in zip(module_dropout, dropped):
        assert torch.equal(session.tensor(node.outputs[0]), eager)  # the mask and its scale, bit for bit
    assert_trains_as_eager(DROPOUT)
    assert program.values["rng_state"].kind == "buffer"
    assert program.buffer_mutations[f"rng_state_updated_step{STEPS - 1}"] == "rng_state"


def test_stepping_back_over_dropout_and_replaying_it_draws_the_same_mask_bit_for_bit():
    session, program = ran(DROPOUT), training(DROPOUT)
    node = next(n for n in program.nodes if n.op == "rewind.seeded_native_dropout.default" and n.step == 1)
    mask = node.outputs[1]
    session.goto(node.index + 1)
    drawn = session.tensor(mask).clone()
    assert session.step(Direction.REVERSE, "instruction").tick == node.index
    session.step(Direction.FORWARD, "instruction")
    assert torch.equal(session.tensor(mask), drawn)
    session.goto(0)
    session.goto(node.index + 1)  # replayed from a checkpoint
    assert torch.equal(session.tensor(mask), drawn)
    assert not torch.equal(drawn, session.tensor(program.nodes[node.index - program.step_starts[1]].outputs[1]))


def test_forensics_on_a_dropout_step_finds_the_float64_reference_agrees(capsys):
    status = forensics_cli.main([str(DROPOUT), "--entry", "train_step", "--steps", "2", "--driver", "torch:cpu",
                                 "--budget-mb", "64", "--no-ablate", "--json"])
    out, err = capsys.readouterr()
    assert status == 0, out + err  # the reference draws the same masks: no divergence


# -- what cannot be traced is told in words, at the user's line ---------------------------------------------------

HEADER = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)

    def forward(self, x):
        return self.l(x)


def train_step():
    torch.manual_seed(0)
    model = Net()
    HOOK
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, (torch.randn(8, 4), torch.randint(0, 3, (8,))), LOSS, opt
'''


def step_file(tmp_path: Path, hook: str = "", loss: str = "nn.CrossEntropyLoss()") -> Path:
    path = tmp_path / "model.py"
    path.write_text(HEADER.replace("HOOK", hook or "pass").replace("LOSS", loss))
    return path


@pytest.mark.parametrize("hook, loss, words", [
    ("model.l.weight.register_hook(lambda g: g.view(5, 5))", "",
     r"model.py:17 `model.l.weight.register_hook\(lambda g: g.view\(5, 5\)\)` failed: shape '\[5, 5\]' is invalid"),
    ("model.l.weight.register_hook(lambda g: g if g.sum() > 0 else -g)", "",
     r"model.py:17 `model.l.weight.register_hook\(lambda g: g if g.sum\(\) > 0 else -g\)` reads a tensor's value .* "
     r"pick with torch.where"),
    ("", "lambda out, y: out.detach().sum() + 0 * out.argmax().float()",
     "the loss does not depend on any parameter the optimizer updates: it is computed from values cut off"),
    ("", "lambda out, y: out[out > 0].sum()",
     r"model.py:19 `.*` makes a tensor whose shape depends on the values .*\(torch.where\(mask, x, 0\)"),
    ("", "lambda out, y: (out * torch.bernoulli(out.sigmoid(), generator=torch.Generator())).mean()",
     "draws random numbers with bernoulli from a torch.Generator of its own"),
], ids=["hook-raises", "hook-reads-a-value", "loss-detached", "shape-of-the-values", "own-generator"])
def test_a_step_that_cannot_be_traced_is_told_at_the_users_line_in_words(tmp_path, hook, loss, words):
    path = step_file(tmp_path, hook, loss or "nn.CrossEntropyLoss()")
    with pytest.raises(ProgramLoadError, match=words) as caught:
        load_program(path, "train_step")
    message = str(caught.value)
    assert "Traceback" not in message and "Error" not in message and "Exception" not in message


def test_rewind_forensics_tells_an_untraceable_step_without_a_traceback(tmp_path, capsys):
    path = step_file(tmp_path, "model.l.weight.register_hook(lambda g: g.view(5, 5))")
    status = forensics_cli.main([str(path), "--entry", "train_step", "--driver", "torch:cpu", "--no-ablate"])
    out, err = capsys.readouterr()
    assert status == 2
    assert "model.py:17" in err and "failed: shape '[5, 5]' is invalid" in err
    assert "Traceback" not in out + err and "RuntimeError" not in out + err


def test_a_loss_of_the_output_and_the_target_without_a_target_among_the_inputs_says_how_to_give_it(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent('''\
        import torch
        from torch import nn

        def train_step():
            m = nn.Linear(3, 1)
            return m, (torch.randn(4, 3),), nn.MSELoss(), torch.optim.SGD(m.parameters(), lr=0.1)
        '''))
    with pytest.raises(ProgramLoadError, match=r"give the target among the inputs, or a loss of the output alone "
                                               r"\(lambda out: ...\)"):
        load_program(path, "train_step")
