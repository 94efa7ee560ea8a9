"""Numerics on any precision mix (issue 28): autocast, casts inside forward and bfloat16 models are clean when
correct and localized to their line when not, training runs are compared step by step from the program's own
state, tolerances follow the terms a value was computed from, and an analysis that cannot run degrades the report
instead of ending it. Through the CLI (`rewind forensics`, `rewind validate`) and the Python API."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from hardware.frontends.torch_export import load_program
from provenance import forensics_cli, validate_cli
from provenance.magnitudes import Magnitudes
from provenance.reference import CARRIED, per_step
from tests.conftest import MODELS, line_of

PRECISION = MODELS / "precision"
FIXED = PRECISION / "fixed"
TRAINING = ("--entry", "train_step", "--steps", "1")  # one step: its forward, backward and update carry the bug

CLEAN = [("autocast_clean", ()), ("half_params", ()), ("bf16_clean", ()),
         ("train_tiny_losses", ("--entry", "train_step", "--steps", "20"))]
# (model, its launch, the headline's words, the fixed copy validated)
PLANTED = [("autocast_accumulation", (), "low-precision accumulation", True),
           ("autocast_train", TRAINING, "low-precision accumulation", True),
           ("half_params_overflow", (), "Inf born", True)]


def run(main, path: Path, *args: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main([str(path), "--driver", "torch:cpu", "--budget-mb", "64", "--json", *args])
    return status, json.loads(out.getvalue())


@pytest.mark.parametrize("model,launch", CLEAN, ids=[c[0] for c in CLEAN])
def test_a_correct_model_on_any_precision_mix_is_clean(model, launch):
    status, report = run(forensics_cli.main, PRECISION / f"{model}.py", "--no-ablate", *launch)
    assert (status, report["headline"]) == (0, "clean"), report["headline"]
    assert report["trials"] == []


@pytest.mark.parametrize("model,launch,words,fixable", PLANTED, ids=[c[0] for c in PLANTED])
def test_a_planted_precision_bug_is_localized_to_its_line_and_its_fix_validates(model, launch, words, fixable):
    path = PRECISION / f"{model}.py"
    status, report = run(forensics_cli.main, path, "--no-ablate", *launch)
    assert status == 1 and words in report["headline"]
    assert f"{path.name}:{line_of(path, '# BUG')}" in report["headline"]
    status, verdict = run(validate_cli.main, FIXED / path.name, "--original", str(path), *launch)
    assert (status, verdict["verdict"]) == (0, "validated"), verdict["reason"]


def test_autocast_casts_are_named_after_the_op_they_feed_at_its_line():
    path = PRECISION / "autocast_clean.py"
    program = load_program(path)
    casts = [n for n in program.nodes if n.op == "aten._to_copy.default" and n.name.startswith("linear")]
    assert {n.name for n in casts} >= {"linear_cast", "linear_cast_1", "linear_cast_2"}
    line = line_of(path, "h = torch.relu(self.fc1(x))")
    assert all(n.loc is not None and n.loc.line == line for n in casts if not n.name.startswith("linear_1"))
    assert all(n.loc is not None for n in program.nodes)  # every node of the region has the user's line


def test_the_reference_of_each_training_step_starts_from_the_programs_own_state():
    from hardware.frontends.torch_train import load_program as load_training
    program = load_training(PRECISION / "train_tiny_losses.py", "train_step", 3)
    seen: list[str] = []
    shadow = per_step(program, lambda name: seen.append(name) or torch.zeros(program.values[name].shape))
    step1 = [n for n in shadow.nodes if n.step == 1]
    read = {name for n in step1 for name in n.input_names()}
    assert CARRIED.format("p_fc1_weight_updated") in read and "p_fc1_weight_updated" not in read
    assert "p_fc1_weight_updated" in seen and all(program.values[n].producer is not None for n in seen)
    assert [n.name for n in shadow.nodes] == [n.name for n in program.nodes]  # the same nodes, the same names


def test_a_loss_near_zero_is_judged_by_the_logits_it_was_computed_from():
    """cross_entropy of confident logits of about 50: the loss is 1e-9 and its rounding is of the logits' size."""
    logits = torch.tensor([[50.0, 0.0, -10.0], [0.0, 49.0, 3.0]], dtype=torch.float64)
    target = torch.tensor([0, 1])

    class Loss(torch.nn.Module):
        def forward(self, z, t):
            return torch.nn.functional.cross_entropy(z, t)

    from hardware.frontends.torch_export import export_program
    program = export_program(Loss(), (logits.float(), target))
    values = {"z": logits, "t": target}
    for node in program.nodes:
        args, kwargs = node.bind(values.__getitem__)
        out = node.target(*args, **kwargs)
        values.update(zip(node.outputs, [out] if isinstance(out, torch.Tensor) else [out[i] for i in
                                                                                       node.output_indices]))
    loss = program.outputs[0]
    assert float(values[loss]) < 1e-8
    assert Magnitudes(program, values.__getitem__).scale(loss) > 10.0


def test_a_user_written_reduction_is_judged_as_the_value_it_is():
    """A forward sum the user writes keeps its own size: a float16 reduction of large terms stays a finding."""
    path = MODELS / "forensics" / "half_reduction.py"
    status, report = run(forensics_cli.main, path, "--no-ablate")
    assert status == 1 and report["divergence"]["node"] == "sum_1"


def test_an_analysis_that_cannot_run_is_reported_and_the_rest_stands(tmp_path):
    """A precision trial that cannot run (a bitcast at another width) is a trial with its reason, not an exit 2."""
    model = tmp_path / "bitcast_then_overflow.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Bits(nn.Module):\n"
        "    def forward(self, x):\n"
        "        bits = x.view(torch.int16)  # a bitcast: no other precision can run it\n"
        "        big = x * 300.0\n"
        "        y = big * big  # BUG: overflows float16\n"
        "        return y.float(), bits\n\n\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return Bits(), (torch.randn(4, 4).half(),)\n")
    status, report = run(forensics_cli.main, model)
    assert status == 1 and f"{model.name}:{line_of(model, '# BUG')}" in report["headline"]
    assert isinstance(report["trials"], list)
    for trial in report["trials"]:
        assert trial["ran"] is False and trial["why"] and "Error" not in trial["why"]


def test_a_training_runs_drift_from_a_free_running_reference_is_a_curve_not_a_finding():
    status, report = run(forensics_cli.main, PRECISION / "train_tiny_losses.py", "--no-ablate", "--entry",
                         "train_step", "--steps", "20")
    curve = report["trajectory"]
    assert status == 0 and [p["step"] for p in curve] == list(range(20))
    assert curve[-1]["difference"] > 100 * curve[0]["difference"]  # float32 and float64 training part ways
    assert all(p["loss"] == p["loss"] and p["reference"] > 0 for p in curve)


def test_the_repair_loop_fixes_an_autocast_accumulation_and_says_the_loop_once(tmp_path):
    """`rewind repair --suggest`: the knowledge base's float32 accumulation validates; the 384 additions it cannot
    put in the source are one line of the report."""
    from provenance import repair_cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = repair_cli.main([str(PRECISION / "autocast_accumulation.py"), "--suggest", "--driver", "torch:cpu",
                                  "--budget-mb", "64", "--knowledge", str(tmp_path / "kb.json"), "--seeds", "1",
                                  "--scales", "8"])
    text = out.getvalue()
    assert status == 0 and "Verdict: validated" in text
    assert text.count("Not in the source:") == 1 and "384 nodes" in text
