"""A training step written as PyTorch users write it, in their own function: `opt.zero_grad()`, a forward and
`loss.backward()` (several, their own micro-batches), `clip_grad_norm_`, `opt.step()` or a GradScaler's
`scaler.step(opt)`, `scheduler.step()`. Each trains bit for bit as the same function run eagerly does, its update's
nodes sit at the lines of those calls, and every step Rewind cannot trace as written is refused in words naming
the step. Tied parameters (GPT-2's lm_head and wte) are one parameter, as torch.optim has them."""

from __future__ import annotations

import functools
import itertools
import re
import textwrap
from pathlib import Path

import pytest
import torch

from hardware.errors import ProgramLoadError
from hardware.frontends.torch_export import user_file
from hardware.frontends.torch_train import load_program
from hardware.session import LaunchOptions, Session
from provenance.hyperparameters import hyperparameter_patches
from tests import test_training_options as options
from tests.conftest import MODELS, line_of

TRAINING = MODELS / "training"
LOOP = TRAINING / "user_step_loop.py"  # train_step(x, y) itself: 2 micro-batches, dropout, clip, AdamW, LambdaLR
SCALER = TRAINING / "user_step_scaler.py"  # train_step() returns (step, inputs): GradScaler, unscale_, clip, SGD
GPT2 = TRAINING / "user_step_gpt2.py"  # a Hugging Face GPT-2 (tied embeddings, dropout) as its examples train it
STEPS = 3
BACKWARD, CLIP = torch.Tensor.backward, torch.nn.utils.clip_grad_norm_


training = functools.partial(options.training, steps=STEPS)
ran = functools.partial(options.ran, steps=STEPS)
in_step = options.in_step


def eager(path: Path, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The file's step function called eagerly `steps` times (on batches() in turn, or the inputs train_step()
    returned): each step's loss, and the parameters after the last."""
    with user_file(path) as module:
        if hasattr(module, "batches"):
            step, model = module.train_step, module.model
            batches = list(itertools.islice(module.batches(), steps))
        else:
            step, inputs = module.train_step()
            model = step.__closure__[step.__code__.co_freevars.index("model")].cell_contents
            batches = [inputs] * steps
        losses = [float(step(*batch)) for batch in batches]
        return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("path", [LOOP, SCALER, GPT2], ids=["micro_batches_clip_schedule", "grad_scaler", "gpt2"])
def test_a_step_the_user_wrote_trains_bit_for_bit_as_the_same_function_run_eagerly(path):
    session, program = ran(path), training(path)
    losses, params = eager(path)
    assert [session.tensor(loss).item() for loss in program.losses] == pytest.approx(losses, rel=1e-6, abs=0)
    for name, param in params.items():
        value = "p_" + name.replace(".", "_")
        assert value in program.gradients[STEPS - 1], f"{name} has no gradient"
        assert torch.equal(session.tensor(in_step(f"{value}_updated", STEPS - 1)), param), name


def test_the_users_micro_batches_sum_at_their_backward_and_the_update_sits_at_the_lines_of_its_calls():
    program, lines = training(LOOP), LOOP.read_text().splitlines()
    step0 = [n for n in program.nodes if n.step == 0]
    at = {phase: {n.loc.line for n in step0 if n.phase == phase and n.loc is not None} for phase in
          ("forward", "backward", "optimizer")}
    forward, backward = line_of(LOOP, "loss = F.cross_entropy"), line_of(LOOP, "loss.backward()")
    model = {line_of(LOOP, "h = self.drop"), line_of(LOOP, "return self.head(h)")}  # Classifier.forward's
    assert at["forward"] == {line_of(LOOP, "x.chunk(MICRO)"), forward, backward} | model  # backward's: the sum
    total = program.nodes[program.values["loss"].producer]
    assert (total.op, total.loc.line) == ("aten.add.Tensor", backward)
    assert at["optimizer"] == {line_of(LOOP, "clip_grad_norm_(model"), line_of(LOOP, "opt.step()")}
    update = [n for n in step0 if n.phase == "optimizer"]
    assert {(f.loc.file, f.loc.function) for n in update for f in n.frames} == {(str(LOOP.resolve()), "train_step")}
    norms = [n for n in step0 if n.op == "aten.linalg_vector_norm.default"]
    assert norms and {n.loc.line for n in norms} == {line_of(LOOP, "clip_grad_norm_(model")}
    assert lines[program.nodes[program.values["lr"].producer].loc.line - 1].strip() == "opt.step()"
    assert program.optimizer == "AdamW"


def test_the_users_scheduler_sets_each_steps_learning_rate_and_a_patch_from_step_k_retraces_their_step():
    session, program = ran(LOOP), training(LOOP)
    lrs = [session.tensor(in_step("lr", k)).item() for k in range(STEPS)]
    assert lrs == pytest.approx([0.01 / 3, 0.02 / 3, 0.01])  # LambdaLR's warmup, stepped by the user after opt.step
    tl = session.tl
    branch = tl.branch(hyperparameter_patches(program, str(LOOP), "train_step", {"eps": 1e-3}, first=1))
    try:
        tl.seek(tl.end)
        assert session.tensor("loss_step1").item() == pytest.approx(eager(LOOP)[0][1], rel=1e-6)  # before it acts
        assert not torch.equal(session.tensor("p_head_weight_updated_step1"), eager(LOOP, 2)[1]["head.weight"])
    finally:
        tl.unbranch(branch)


def test_a_grad_scaler_in_the_users_step_is_the_scaler_of_the_program():
    session, program = ran(SCALER), training(SCALER)
    assert {"grad_scale", "growth_tracker", "found_inf"} <= set(program.values)
    assert session.tensor("found_inf").item() == 0.0
    assert session.tensor("grad_scale_updated_step1").item() == 2.0 ** 11  # growth_interval=2: it grew once
    lines = {n.loc.line for n in program.nodes if n.step == 0 and n.phase == "optimizer"}
    assert lines == {line_of(SCALER, "scaler.unscale_(opt)"), line_of(SCALER, "clip_grad_norm_"),
                     line_of(SCALER, "scaler.step(opt)"), line_of(SCALER, "scaler.update()")}


def test_tied_parameters_are_one_parameter_of_the_step_whose_gradient_sums_both_uses(tmp_path):
    """GPT-2's lm_head.weight is its wte.weight: torch.export lifts both names, torch.optim holds one tensor."""
    program = training(GPT2)
    assert "p_lm_head_weight" not in program.values
    reads = [n for n in program.nodes if n.step == 0 and n.phase == "forward"
             and any(getattr(a, "name", None) == "p_transformer_wte_weight" for a in n.args)]
    assert len(reads) >= 2  # the embedding and the head
    tuple_form = tmp_path / "tied.py"  # the same model returned as (model, inputs, optimizer): trained as eager
    tuple_form.write_text(textwrap.dedent('''\
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        def train_step():
            torch.manual_seed(0)
            config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
            model = GPT2LMHeadModel(config).train()
            ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
            return model, {"input_ids": ids, "labels": ids}, torch.optim.AdamW(model.parameters(), lr=1e-2)
    '''))
    session = ran(tuple_form, steps=2)
    with user_file(tuple_form) as module:
        model, inputs, opt = module.train_step()
        for _ in range(2):
            opt.zero_grad()
            model(**inputs).loss.backward()
            opt.step()
    assert torch.equal(session.tensor("p_transformer_wte_weight_updated_step1"), model.transformer.wte.weight)


# -- what a step of the user's own cannot do, said in words --------------------------------------------------------

STEP = '''\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(3, 2)
other = nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")


def train_step(x, y):
{body}


def batches():
    while True:
        yield torch.ones(4, 3), torch.zeros(4, 2)
'''
LOSS = "loss = nn.functional.mse_loss(model(x), y)"
REFUSED = [
    ("never_clears", [LOSS, "loss.backward()", "opt.step()"], "never clears the gradients (opt.zero_grad()"),
    ("steps_twice", ["opt.zero_grad()", LOSS, "loss.backward()", "opt.step()", "opt.step()"],
     "steps the optimizer twice"),
    ("backward_after_step", ["opt.zero_grad()", LOSS, "loss.backward()", "opt.step()", "loss.backward()"],
     "calls backward() after opt.step()"),
    ("no_backward", ["opt.zero_grad()", LOSS, "opt.step()"], "steps the optimizer before any backward()"),
    ("no_step", ["opt.zero_grad()", LOSS, "loss.backward()"], "never steps its optimizer"),
    ("clips_some", ["opt.zero_grad()", LOSS, "loss.backward()",
                    "torch.nn.utils.clip_grad_norm_([model.weight], 1.0)", "opt.step()"],
     "clips the norm of some of the parameters"),
    ("clip_before_backward", ["opt.zero_grad()", "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)", LOSS,
                              "loss.backward()", "opt.step()"], "no gradients to clip"),
    ("reads_the_norm", ["opt.zero_grad()", LOSS, "loss.backward()",
                        "norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)", "print(f'{norm:.3f}')",
                        "opt.step()"], "reads the total norm clip_grad_norm_ returns"),
    ("inf_norm", ["opt.zero_grad()", LOSS, "loss.backward()",
                  "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=float('inf'))", "opt.step()"],
     "clips the 2-norm"),
    ("closure", ["opt.zero_grad()", LOSS, "loss.backward()", "opt.step(lambda: loss)"], "opt.step(closure)"),
    ("scaled_then_opt_step", ["opt.zero_grad()", LOSS, "scaler.scale(loss).backward()", "opt.step()"],
     "scaler.step(opt) unscales them first"),
    ("scaler_never_updates", ["opt.zero_grad()", LOSS, "scaler.scale(loss).backward()", "scaler.step(opt)"],
     "never calls scaler.update()"),
    ("clip_scaled", ["opt.zero_grad()", LOSS, "scaler.scale(loss).backward()",
                     "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)", "scaler.step(opt)", "scaler.update()"],
     "on the scaled gradients"),
    ("vector_backward", ["opt.zero_grad()", "model(x).backward(y)", "opt.step()"], "with a gradient"),
    ("not_a_loss", ["opt.zero_grad()", "model(x).sum(0).backward()", "opt.step()"], "not a loss"),
]


@pytest.mark.parametrize("body,words", [(b, w) for _, b, w in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_step_the_user_wrote_that_rewind_cannot_trace_as_written_is_refused_in_words(tmp_path, body, words):
    path = tmp_path / "model.py"
    path.write_text(STEP.format(body="\n".join("    " + line for line in body)))
    with pytest.raises(ProgramLoadError) as caught:
        load_program(path, "train_step", 2)
    message = str(caught.value)
    assert words in message and f"the step train_step() in {path}" in message, message
    assert "Traceback" not in message and "Error" not in message
    # What the step's run replaced is put back, even on a refusal.
    assert torch.Tensor.backward is BACKWARD and torch.nn.utils.clip_grad_norm_ is CLIP
    with user_file(path) as module:
        assert "step" not in vars(module.opt) and "zero_grad" not in vars(module.model)


FOUND = [
    ("no_optimizer", "model = nn.Linear(3, 2)\n\n\ndef train_step(x, y):\n    model(x).sum().backward()\n",
     "reaches no torch.optim optimizer"),
    ("two_optimizers", "model = nn.Linear(3, 2)\na = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                       "b = torch.optim.Adam(model.parameters())\n\n\ndef train_step(x, y):\n    a.step()\n    b.step()\n",
     "reaches 2 optimizers"),
    ("no_batches", "model = nn.Linear(3, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n\n"
                   "def train_step(x, y):\n    model(x).sum().backward()\n    opt.step()\n", "takes a batch (x, y)"),
    ("unknown_model", "opt = torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1)\n\n\n"
                      "def train_step(x, y):\n    opt.step()\n", "no module the step"),
]


@pytest.mark.parametrize("source,words", [(s, w) for _, s, w in FOUND], ids=[f[0] for f in FOUND])
def test_what_a_users_step_trains_with_is_found_among_what_it_reaches_or_refused_in_words(tmp_path, source, words):
    path = tmp_path / "model.py"
    batches = "\n\ndef batches():\n    yield torch.ones(1, 3), torch.ones(1, 2)\n"
    path.write_text("import torch\nfrom torch import nn\n\n" + source + ("" if "takes a batch" in words else batches))
    with pytest.raises(ProgramLoadError, match=re.escape(words)) as caught:
        load_program(path, "train_step", 1)
    assert "Traceback" not in str(caught.value) and "Error" not in str(caught.value)


def test_a_zero_grad_between_backwards_drops_the_losses_before_it_as_it_drops_their_gradients(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(STEP.format(body="\n".join("    " + line for line in [
        "model.zero_grad()", LOSS, "(loss * 100).backward()", "opt.zero_grad()", LOSS, "loss.backward()",
        "opt.step()"])))
    session = ran(path, steps=2)
    with user_file(path) as module:
        expected = []
        for _ in range(2):
            x, y = next(module.batches())
            expected.append(module.nn.functional.mse_loss(module.model(x), y).item())
            module.train_step(x, y)
        assert torch.equal(session.tensor("p_weight_updated_step1"), module.model.weight)
    assert [session.tensor(n).item() for n in ("loss", "loss_step1")] == pytest.approx(expected, rel=1e-6)


def test_batches_is_called_once_so_the_first_step_runs_the_batch_it_was_traced_with(tmp_path):
    """batches() reading an iterator it opened once (a DataLoader's, a file's) yields each batch once: the load calls
    it once, and the step traced on its first batch runs that batch, then the second, as eager does."""
    path = tmp_path / "loader.py"
    path.write_text(textwrap.dedent('''
        import torch
        from torch import nn

        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = iter([(torch.full((2, 4), float(k)), torch.zeros(2, 1)) for k in range(1, 9)])
        calls = []

        def train_step(x, y):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.item()

        def batches():
            calls.append(1)
            yield from data
        '''))
    program = load_program(path, "train_step", 2)
    firsts = {n: t for n, t in program.initial.items() if n.startswith("x")}
    assert sorted(float(t[0, 0]) for t in firsts.values()) == [1.0, 2.0], sorted(firsts)
    with user_file(path) as module:
        losses = [module.train_step(x, y) for x, y in itertools.islice(module.batches(), 2)]
    session = Session(None)
    session.launch(LaunchOptions(str(path), entry="train_step", steps=2, driver="torch:cpu"), program=program)
    session.start()
    assert session.run().reason == "end"
    assert [session.tensor(loss).item() for loss in program.losses] == pytest.approx(losses, rel=1e-6)
