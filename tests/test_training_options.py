"""What a training loop does around its step, as train_step() returns it after the optimizer: an lr scheduler (each
step's learning rate a value of the Program, patched from step k), gradient accumulation over micro-batches,
clip_grad_norm_, SGD's dampening, a loss of torch.linalg.vector_norm, and zero_grad(set_to_none=True)'s parameter
with no gradient; each trains as the eager loop a user writes does, and every malformed return is refused in words."""

from __future__ import annotations

import functools
import itertools
import textwrap
from pathlib import Path

import pytest
import torch

from hardware.errors import ProgramLoadError, RewindError
from hardware.frontends.torch_export import user_file
from hardware.frontends.torch_train import load_program
from hardware.session import LaunchOptions, Session
from provenance.hyperparameters import hyperparameter_patches
from tests.conftest import MODELS

TRAINING = MODELS / "training"
SCHEDULE = TRAINING / "lr_schedule.py"  # LambdaLR warmup then decay; SGD with momentum and dampening
PLANTED_SCHEDULE = TRAINING / "planted_lr_schedule.py"  # StepLR's gamma of 10 (0.1 meant): the loss climbs from step 4
ACCUMULATE = TRAINING / "accumulate_micro_batches.py"  # 4 micro-batches a step, AdamW
CLIPPED = TRAINING / "clipped_norm_loss.py"  # a vector_norm loss, clip_grad_norm 0.5, a parameter no loss reaches
STEPS = 6
SAME = {"rtol": 1e-6, "atol": 1e-7}


@functools.lru_cache(maxsize=None)
def training(path: Path, steps: int = STEPS):
    return load_program(path, "train_step", steps)


@functools.lru_cache(maxsize=None)
def ran(path: Path, steps: int = STEPS) -> Session:
    session = Session(None)
    session.launch(LaunchOptions(str(path), entry="train_step", steps=steps, driver="torch:cpu", stop_on_entry=True),
                   program=training(path, steps))
    session.start()
    assert session.run().reason == "end"
    return session


def eager_loop(path: Path, steps: int = STEPS) -> list[dict]:
    """The loop a PyTorch user writes around the file's train_step(): for each step, zero_grad(set_to_none=True), a
    forward and backward per micro-batch, clip_grad_norm_, optimizer.step() (through the GradScaler when there is one),
    scheduler.step(). Each step's loss (summed over its micro-batches), learning rates and parameters after it."""
    with user_file(path) as module:
        model, inputs, loss_fn, optimizer, *extras = module.train_step()
        options = next((e for e in extras if isinstance(e, dict)), {})
        scheduler = next((e for e in extras if isinstance(e, torch.optim.lr_scheduler.LRScheduler)), None)
        scaler = next((e for e in extras if isinstance(e, torch.amp.GradScaler)), None)
        micro = options.get("accumulate", 1)
        batches = list(itertools.islice(module.batches(), steps * micro)) if hasattr(module, "batches") \
            else [inputs] * (steps * micro)
    out = []
    for k in range(steps):
        model.zero_grad(set_to_none=True)
        total = None
        for batch in batches[k * micro:(k + 1) * micro]:
            loss = loss_fn(model(*batch[:-1]), batch[-1])
            (scaler.scale(loss) if scaler is not None else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        lrs = [group["lr"] for group in optimizer.param_groups]
        if scaler is not None:
            scaler.unscale_(optimizer)
        if "clip_grad_norm" in options:
            torch.nn.utils.clip_grad_norm_(model.parameters(), options["clip_grad_norm"])
        if scaler is not None:
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        out.append({"loss": total, "lr": lrs, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                    **({"scale": scale, "next_scale": scaler.get_scale()} if scaler is not None else {})})
    return out


def in_step(name: str, k: int) -> str:
    return name if k == 0 else f"{name}_step{k}"


def assert_trains_as_eager(path: Path) -> list[dict]:
    session, program = ran(path), training(path)
    eager = eager_loop(path)
    for k, step in enumerate(eager):
        torch.testing.assert_close(session.tensor(program.losses[k]), step["loss"], **SAME)
        for name, param in step["params"].items():
            value = "p_" + name.replace(".", "_")
            got = session.tensor(in_step(f"{value}_updated", k) if value in program.gradients[k] else value)
            torch.testing.assert_close(got, param, **SAME)
    return eager


# -- an lr scheduler: each step's learning rate is a value -------------------------------------------------------

def test_a_schedulers_learning_rate_is_a_value_of_each_step_and_the_run_trains_as_eager():
    eager = assert_trains_as_eager(SCHEDULE)  # SGD with momentum and dampening too: the first step undamped
    session, program = ran(SCHEDULE), training(SCHEDULE)
    lrs = [session.tensor(in_step("lr", k)).item() for k in range(STEPS)]
    assert lrs == [step["lr"][0] for step in eager] and len(set(lrs)) > 2  # warmup, then decay
    node = program.nodes[program.values["lr_step3"].producer]
    assert (node.name, node.step, node.phase) == ("lr_step3", 3, "optimizer")
    weights = [session.tensor(in_step("momentum_grad_weight", k)).item() for k in range(STEPS)]
    assert weights == [1.0] + [0.9] * (STEPS - 1)  # torch.optim copies the first gradient into a fresh buffer


def test_the_learning_rate_patched_from_step_k_replaces_the_schedule_from_there_and_keeps_the_loss_down():
    session, program = ran(PLANTED_SCHEDULE), training(PLANTED_SCHEDULE)
    original = [session.tensor(loss).item() for loss in program.losses]
    assert original[-1] > 10 * min(original)  # the planted schedule: the loss climbs
    tl = session.tl
    branch = tl.branch(hyperparameter_patches(program, str(PLANTED_SCHEDULE), "train_step", {"lr": 0.005}, first=4))
    tl.seek(tl.end)
    assert [session.tensor(in_step("lr", k)).item() for k in range(STEPS)] == [0.05, 0.05, 0.5, 0.5, 0.005, 0.005]
    patched = [session.tensor(loss).item() for loss in program.losses]
    assert patched[:5] == original[:5] and patched[-1] < original[-1] / 10
    tl.unbranch(branch)
    assert session.tensor("lr_step4").item() == pytest.approx(5.0)


# -- accumulation, clipping, vector_norm, a parameter with no gradient -------------------------------------------

def test_accumulation_over_4_micro_batches_equals_the_eager_loop():
    assert_trains_as_eager(ACCUMULATE)
    program = training(ACCUMULATE)
    assert [n for n in program.values if n.startswith("x_micro") and "_step" not in n] == \
        ["x_micro1", "x_micro2", "x_micro3"]
    forwards = [n for n in program.nodes if n.step == 0 and n.phase == "forward" and n.op == "aten.addmm.default"]
    assert len(forwards) == 2 * 4  # two linears, four micro-batches
    with user_file(ACCUMULATE) as module:
        fourth = list(itertools.islice(module.batches(), 4 * 2))[4 + 3][0]  # step 1's last micro-batch
    assert torch.equal(ran(ACCUMULATE).tensor("x_micro3_step1"), fourth)


def test_clip_grad_norm_a_vector_norm_loss_and_a_parameter_without_a_gradient_train_as_eager():
    assert_trains_as_eager(CLIPPED)
    session, program = ran(CLIPPED), training(CLIPPED)
    assert "p_unused" not in program.gradients[0]  # zero_grad(set_to_none=True): no gradient, no update
    assert torch.equal(session.tensor("p_unused"), torch.ones(3))
    norms = [n for n in program.nodes if n.step == 0 and n.op == "aten.linalg_vector_norm.default"]
    assert {n.phase for n in norms} == {"forward", "optimizer"}  # the loss's and the clipping's


# -- what train_step() returns after the optimizer, checked ------------------------------------------------------

HEADER = '''\
import torch
from torch import nn


def train_step():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    return model, (torch.randn(4, 3), torch.randn(4, 1)), nn.MSELoss(), opt, EXTRAS
'''


@pytest.mark.parametrize("extras, words", [
    ("{'accumulate': 0}", "the step option accumulate=0; accumulate is the micro-batches of a step, a whole number "
                          "from 1 to 256"),
    ("{'accumulate': '4'}", "accumulate='4'; accumulate is"),
    ("{'accumulate': True}", "accumulate=True; accumulate is"),
    ("{'accumulate': 4.0}", "accumulate=4.0; accumulate is"),
    ("{'accumulate': 10**9}", "accumulate=1000000000; accumulate is"),
    ("{'clip_grad_norm': float('nan')}", "clip_grad_norm=nan; clip_grad_norm is the total norm the gradients are "
                                         "clipped to"),
    ("{'clip_grad_norm': -1.0}", "clip_grad_norm=-1.0"),
    ("{'clip_grad_norm': [1.0]}", r"clip_grad_norm=\[1.0\]"),
    ("{'accumulat': 4}", "the step option 'accumulat'; a step's options are accumulate: .*; clip_grad_norm: "),
    ("{1: 2}", "the step option 1; a step's options are"),
    ("'fast'", "returned a str after the optimizer, where its learning-rate scheduler"),
    ("None", "returned a NoneType after the optimizer"),
    ("{}, {}", "returned two dicts of options after the optimizer; a step takes one"),
    ("torch.optim.lr_scheduler.StepLR(other, 2)", "schedules another optimizer than the one it returned"),
    ("torch.optim.lr_scheduler.ReduceLROnPlateau(opt)", "ReduceLROnPlateau scheduler, which sets the learning rate "
                                                        "from the losses"),
    ("torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (k - 2))", r"the learning-rate scheduler LambdaLR failed "
                                                                      r"to step: division by zero \(at model.py:"),
    ("torch.optim.lr_scheduler.LambdaLR(opt, lambda k: float('inf'))", "sets the learning rate of step 0 to inf"),
    ("torch.amp.GradScaler('cpu'), torch.amp.GradScaler('cpu')", "returned two GradScalers"),
    ("torch.optim.lr_scheduler.OneCycleLR(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), 1.0, "
     "total_steps=10)", "schedules another optimizer"),
    ("torch.optim.lr_scheduler.OneCycleLR(opt, 1.0, total_steps=10)",
     "OneCycleLR changes the optimizer's momentum from step to step, and Rewind follows a schedule of the learning "
     r"rate only: keep the rest fixed \(OneCycleLR\(..., cycle_momentum=False\)\)"),
], ids=["accumulate-0", "accumulate-text", "accumulate-bool", "accumulate-float", "accumulate-huge", "clip-nan",
        "clip-negative", "clip-list", "option-misspelt", "option-number", "a-string", "none", "two-dicts",
        "scheduler-of-another", "plateau", "scheduler-raises", "scheduler-inf", "two-scalers",
        "one-cycle-of-another", "one-cycle-momentum"])
def test_what_train_step_returns_after_the_optimizer_is_checked_in_words(tmp_path, extras, words):
    path = tmp_path / "model.py"
    path.write_text(HEADER.replace("EXTRAS", extras))
    with pytest.raises(ProgramLoadError, match=words) as caught:
        load_program(path, "train_step", 4)
    message = str(caught.value)
    assert "Traceback" not in message and "Error" not in message and "Exception" not in message


def test_batches_too_few_for_the_micro_batches_of_every_step_are_counted_in_words(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(HEADER.replace("EXTRAS", "{'accumulate': 3}") + textwrap.dedent('''

        def batches():
            for _ in range(5):
                yield torch.randn(4, 3), torch.randn(4, 1)
        '''))
    with pytest.raises(ProgramLoadError, match=r"gave 5 batches; 2 steps of 3 micro-batches need 6"):
        load_program(path, "train_step", 2)


@pytest.mark.parametrize("lr, words", [("fast", "lr must be a finite number"), (-1.0, "0 or above"),
                                       (0.05, "already has lr=0.05 in every step from step 0 on")])
def test_a_bad_learning_rate_patch_is_refused_in_words(lr, words):
    program = training(PLANTED_SCHEDULE, 2)
    with pytest.raises(RewindError, match=words):
        hyperparameter_patches(program, str(PLANTED_SCHEDULE), "train_step", {"lr": lr})


def test_a_grad_scaler_over_float16_parameters_is_refused_as_grad_scaler_refuses_it(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent('''\
        import torch
        from torch import nn

        def train_step():
            model = nn.Linear(3, 1).half()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = torch.randn(4, 3).half(), torch.randn(4, 1).half()
            return model, (x, y), nn.MSELoss(), opt, torch.amp.GradScaler("cpu")
        '''))
    with pytest.raises(ProgramLoadError, match="'p_weight' is a float16 parameter, whose gradient GradScaler refuses "
                                               "to unscale .* under torch.autocast"):
        load_program(path, "train_step")


def test_accumulation_carries_batch_norms_running_statistics_from_micro_batch_to_micro_batch(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent('''\
        import torch
        from torch import nn

        def train_step():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            return model, next(batches()), nn.MSELoss(), opt, {"accumulate": 3}

        def batches():
            g = torch.Generator().manual_seed(1)
            while True:
                yield torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)
        '''))
    program = load_program(path, "train_step", 2)
    session = Session(None)
    session.launch(LaunchOptions(str(path), entry="train_step", steps=2, driver="torch:cpu"), program=program)
    assert session.run().reason == "end"
    for k, step in enumerate(eager_loop(path, 2)):
        torch.testing.assert_close(session.tensor(program.losses[k]), step["loss"], **SAME)
    torch.testing.assert_close(session.tensor("b_1_running_mean"), eager_running_mean(path, 2), **SAME)


def eager_running_mean(path: Path, steps: int) -> torch.Tensor:
    with user_file(path) as module:
        model, _, loss_fn, opt, options = module.train_step()
        batches = module.batches()
        for _ in range(steps):
            opt.zero_grad()
            for _ in range(options["accumulate"]):
                x, y = next(batches)
                loss_fn(model(x), y).backward()
            opt.step()
    return model[1].running_mean
