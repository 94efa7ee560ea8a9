"""torch.amp.GradScaler in a training step (train_step() returning it after the optimizer): the loss scaled, the
gradients unscaled and checked for inf (`found_inf`), the update kept only where the step is not skipped, the scale
and its growth tracker carried from step to step; equal to eager GradScaler("cpu") bit for bit, and a step skipped
on inf float16 gradients explained by `rewind forensics`."""

from __future__ import annotations

import json

import pytest
import torch

from provenance import forensics_cli
from tests.conftest import MODELS, line_of
from tests.test_training_options import eager_loop, in_step, ran, training

TRAINING = MODELS / "training"
OVERFLOW = TRAINING / "planted_grad_scaler_overflow.py"  # a summed loss: its fp16 gradient overflows step after step
CLEAN = TRAINING / "grad_scaler_clean.py"  # a mean loss: no step skipped, the scale grows every 3 steps
STEPS = 6


@pytest.mark.parametrize("path", [OVERFLOW, CLEAN], ids=["skips-every-step", "skips-none"])
def test_a_grad_scaler_step_is_eager_grad_scalers_bit_for_bit(path):
    session, program = ran(path), training(path)
    for k, step in enumerate(eager_loop(path, STEPS)):
        assert torch.equal(session.tensor(program.losses[k]), step["loss"])
        assert session.tensor(in_step("grad_scale_updated", k)).item() == step["next_scale"]
        for name, param in step["params"].items():
            assert torch.equal(session.tensor(in_step("p_" + name.replace(".", "_") + "_updated", k)), param)


def test_an_overflowing_step_is_skipped_and_its_scale_halved_and_a_clean_one_grows_its_scale():
    skipped, clean = ran(OVERFLOW), ran(CLEAN)
    assert [skipped.tensor(in_step("found_inf", k)).item() for k in range(STEPS)] == [1.0] * STEPS
    assert [skipped.tensor(in_step("grad_scale_updated", k)).item() for k in range(STEPS)] == \
        [65536.0 / 2 ** (k + 1) for k in range(STEPS)]
    program = training(OVERFLOW)
    start = program.initial["p_out_weight"]
    assert torch.equal(skipped.tensor(in_step("p_out_weight_updated", STEPS - 1)), start)  # never trained
    assert [clean.tensor(in_step("found_inf", k)).item() for k in range(STEPS)] == [0.0] * STEPS
    assert [clean.tensor(in_step("growth_tracker_updated", k)).item() for k in range(STEPS)] == [1, 2, 0, 1, 2, 0]
    found = program.nodes[program.values["found_inf_step2"].producer]
    assert (found.name, found.phase, found.step) == ("found_inf_step2", "optimizer", 2)
    assert program.values["grad_scale"].kind == "buffer" and program.buffer_mutations["grad_scale_updated_step1"] == \
        "grad_scale"


def test_rewind_forensics_explains_the_skipped_step_the_scale_and_the_line(capsys):
    status = forensics_cli.main([str(OVERFLOW), "--entry", "train_step", "--steps", "3", "--driver", "torch:cpu",
                                 "--budget-mb", "64", "--no-ablate", "--json"])
    out, err = capsys.readouterr()
    assert status == 1, out + err
    report = json.loads(out)
    first = report["nonfinite"]
    assert first["pattern"]["pattern"] == "skipped-step" and (first["step"], first["phase"]) == (0, "backward")
    assert first["source"]["line"] == line_of(OVERFLOW, "return self.out(torch.tanh(")
    because = first["pattern"]["reason"]
    assert "GradScaler found inf gradients ('found_inf' is 1) and skipped the step" in because
    assert "the scale went from 65536 to 32768. Skipped: every step" in because
    assert "a mean, not a sum" in first["pattern"]["fix"]
    assert "a step torch.amp.GradScaler skipped on inf gradients" in report["headline"]
    assert "Traceback" not in out + err


def test_rewind_forensics_of_a_clean_grad_scaler_run_is_clean(capsys):
    status = forensics_cli.main([str(CLEAN), "--entry", "train_step", "--steps", "3", "--driver", "torch:cpu",
                                 "--budget-mb", "64", "--no-ablate", "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert status == 0 and report["nonfinite"] is None and report["divergence"] is None, out
    assert "Traceback" not in out + err


def test_a_node_of_the_whole_update_is_no_parameters_and_a_parameters_own_is_that_parameters():
    """found_inf and a step's learning rate reach every parameter's write: the stack reads "update of the
    parameters" there, and a node on one parameter's way, that parameter."""
    session, program = ran(OVERFLOW), training(OVERFLOW)
    found = program.nodes[program.values[in_step("found_inf", 1)].producer]
    assert session.state.update_of(found).endswith("update of the parameters")
    own = program.nodes[program.values[in_step("p_out_weight_updated", 1)].producer]
    assert session.state.update_of(own).endswith("update of out.weight")
