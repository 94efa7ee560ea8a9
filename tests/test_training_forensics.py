"""Forensics on gradients and experiments across steps: each planted training bug localized to its `# BUG` line by
`rewind forensics`/`rewind repair --entry train_step`, its fix validated by the repair loop (or, for the double
where in the source, by `rewind validate`); an optimizer's learning rate patched from a step on, its loss curve
measured against the original and undone bit for bit, over the Session, DAP and the console; and refusals in words."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
from pathlib import Path

import pytest
import torch

from dap_server.client import DapError
from hardware.errors import RewindError
from hardware.session import LaunchOptions, Session
from provenance import forensics_cli, repair_cli, validate_cli
from provenance.ablation import ablate
from provenance.fixes import named_patch
from provenance.knowledge import KnowledgeBase
from provenance.problems import collect
from provenance.program_edits import ProgramEdit
from tests.conftest import EXAMPLES, MODELS, line_of, program
from tests.dap.wire import Debugger, SchemaCheck, rewind

TRAINING = MODELS / "training"
WHERE_LOG = TRAINING / "planted_where_log.py"
SQRT = TRAINING / "planted_pairwise_sqrt.py"
UNDERFLOW = TRAINING / "planted_fp16_underflow.py"
EXPLODING = TRAINING / "planted_exploding.py"
ADAM_EPS = TRAINING / "planted_adam_eps.py"
CURVE = TRAINING / "returns_loss.py"  # Adam on a small regression: the experiments' model
CURVE_STEPS, FROM_STEP = 6, 3

# model -> (its steps, the pattern forensics names at its BUG line, the fix that validates, the step whose update
# the reference itself blew up: after it, the fixed Program at float64 judges the outputs)
PLANTED = {
    WHERE_LOG: (1, "nan-gradient-through-where", "div_where_gradient_is_zero in place of log_backward", None),
    SQRT: (1, "sqrt-at-zero-gradient", "sqrt_with_epsilon in place of sqrt", None),
    UNDERFLOW: (1, "gradient-underflow", "loss scaling by", None),
    EXPLODING: (3, "exploding-gradients", "the gradients clipped to norm 1", 0),
    ADAM_EPS: (1, "adam-epsilon-underflow", "the optimizer's update in float32", None),
}
FAST_INPUTS = ["--seeds", "1", "--scales", "2", "--shapes", "0"]  # the example, one seed, one range


def main_json(main, argv: list[str]) -> tuple[int, dict]:
    """A command's exit status and its --json report, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main([*argv, "--json"])
    return status, json.loads(out.getvalue())


def bug_line(path: Path) -> int:
    return line_of(path, "# BUG")


# -- each planted bug: localized, classified, fixed --------------------------------------------------------------

@pytest.mark.parametrize("path", list(PLANTED), ids=[p.stem for p in PLANTED])
def test_each_planted_training_bug_is_found_at_its_line_and_its_fix_validates(path, tmp_path):
    steps, pattern, fix, exploded = PLANTED[path]
    knowledge = tmp_path / "fixes.json"
    status, report = main_json(repair_cli.main, [str(path), "--entry", "train_step", "--steps", str(steps),
                                                 "--knowledge", str(knowledge), *FAST_INPUTS])
    found = next(f for f in report["findings"] if f["pattern"] and f["pattern"]["pattern"] == pattern)
    assert found["source"] == {"file": str(path), "line": bug_line(path)}
    assert found["phase"] in ("forward", "backward", "optimizer") and 0 <= found["step"] < steps
    assert status == 0 and report["verdict"] == "validated", report["reason"]
    assert report["fix"]["name"].startswith(fix)
    checks = report["attempts"][-1]["validation"]["checks"]
    assert {c["referenceExplodedAt"] for c in checks} == {exploded}
    assert KnowledgeBase(knowledge).fixes[0]["pattern"] == pattern  # recorded, to be suggested first next time


def test_forensics_names_the_forward_line_a_nan_gradient_was_born_in_the_backward_of():
    status, report = main_json(forensics_cli.main, [str(WHERE_LOG), "--entry", "train_step", "--no-ablate"])
    line = bug_line(WHERE_LOG)
    assert status == 1
    assert report["headline"].startswith(f"4 NaN born in the backward of `log` at {WHERE_LOG.name}:{line} (step 0) "
                                         "(a NaN gradient through a masked `where`)")
    nonfinite = report["nonfinite"]
    assert (nonfinite["phase"], nonfinite["step"], nonfinite["forwardNode"], nonfinite["op"]) == (
        "backward", 0, "log", "aten.div.Tensor")
    assert nonfinite["forwardSource"] == f"{WHERE_LOG}:{line}" and nonfinite["source"]["line"] == line
    assert "the backward still differentiates `log` there" in nonfinite["pattern"]["reason"]


@functools.lru_cache(maxsize=None)
def launched(path: Path, steps: int = 1) -> Session:
    session = Session(None)
    session.launch(LaunchOptions(str(path), entry="train_step", steps=steps, driver="torch:cpu"))
    return session


def test_an_editor_shows_a_backward_nan_at_the_forward_line_and_an_optimizer_failure_where_the_optimizer_is_made():
    [nan] = [p for p in collect(launched(WHERE_LOG)) if p.severity == "error"]
    assert nan.kind == "nan" and nan.frames[-1].loc.line == bug_line(WHERE_LOG)
    assert nan.message.startswith(f"first NaN in the backward of `log` at {WHERE_LOG.name}:{bug_line(WHERE_LOG)}")
    adam = [p for p in collect(launched(ADAM_EPS)) if p.kind == "inf"]
    assert adam and adam[0].frames[-1].loc.line == bug_line(ADAM_EPS) and "in the Adam update" in adam[0].message


def test_an_optimizer_epsilon_float16_cannot_hold_is_suggested_one_it_can_in_every_step(tmp_path):
    session = launched(ADAM_EPS)
    finding = session.forensics.first_nonfinite()
    suggested = {c.name: c for c in KnowledgeBase(tmp_path / "fixes.json").suggest(finding, session.forensics)}
    eps = suggested["the optimizer's eps 1e-08 -> 0.0001"]
    parameters = [n for n, v in session.program.values.items() if v.kind == "parameter"]
    assert len(eps.patches) == len(parameters) and all(p.changes == (("eps", 1e-4),) for p in eps.patches)
    assert list(suggested).index("the optimizer's update in float32") < list(suggested).index(eps.name)


def test_a_float16_gradient_flushed_to_zero_is_introduced_by_its_backward_node_and_float32_there_fixes_it():
    f = launched(UNDERFLOW).forensics
    found = f.first_divergence()
    assert found.node.phase == "backward" and not found.introduced.within  # introduced here, not inherited
    assert f.program.forward_node(found.node).loc.line == bug_line(UNDERFLOW)
    assert not all(c.within for c in f.outputs())  # the lost gradient moves the trained weight off
    feeding = [n for n in f.program.nodes if n.phase == "backward" and n.index <= found.node.index]
    assert ablate(f, feeding, "float32").fixed  # the float64 reference ran the joint graph; ablation reruns it


def test_the_double_where_written_into_a_copy_of_the_model_validates_with_rewind_validate():
    fixed = TRAINING / "planted_where_log_double_where.py"
    status, report = main_json(validate_cli.main, [str(fixed), "--original", str(WHERE_LOG), "--entry", "train_step",
                                                   *FAST_INPUTS])
    assert status == 0 and report["verdict"] == "validated", report["reason"]
    added = [n["op"] for hunk in report["changes"]["hunks"] for n in hunk["fixed"]]
    assert added.count("aten.where.self") >= 2  # the forward's inner where, and its backward


def test_a_recorded_program_edit_is_suggested_again_and_a_damaged_one_is_refused_in_words(tmp_path):
    path = tmp_path / "fixes.json"
    edit = {"op": "", "hops": None, "node": "", "kind": "program", "edit": "gradient-clipping",
            "settings": {"maxNorm": 1.0}}
    entry = {"pattern": "exploding-gradients", "name": "clip", "patches": [edit], "validations": 1}
    path.write_text(json.dumps({"format": "rewind-fixes/1", "fixes": [entry]}))
    session = launched(EXPLODING, 3)
    finding = session.forensics.first_nonfinite()
    [learned, *_] = KnowledgeBase(path).suggest(finding, session.forensics)
    assert (learned.origin, learned.edit) == ("learned", ProgramEdit.of("gradient-clipping", {"maxNorm": 1.0}))
    path.write_text(json.dumps({"format": "rewind-fixes/1", "fixes": [{**entry, "patches": [{**edit,
                                                                                            "settings": 3}]}]}))
    with pytest.raises(RewindError, match="entry 1 has a program patch without a valid 'settings'"):
        KnowledgeBase(path)


@pytest.mark.parametrize("kind, settings, words", [
    ("gradient-clipping", {"maxNorm": -1.0}, "takes maxNorm: positive numbers"),
    ("loss-scaling", {"scale": True}, "takes scale: positive numbers"),
    ("loss-scaling", {"factor": 2.0}, "takes scale"),
    ("warmup", {}, "no program edit 'warmup' \\(edits: loss-scaling, gradient-clipping\\)"),
])
def test_a_program_edit_with_bad_settings_is_refused_in_words(kind, settings, words):
    with pytest.raises(RewindError, match=words):
        ProgramEdit.of(kind, settings)


def test_a_program_edit_of_an_inference_pass_is_refused_in_words():
    with pytest.raises(RewindError, match="edits a training step; mlp is an inference pass"):
        ProgramEdit.of("loss-scaling", {"scale": 8.0}).apply(program(str(EXAMPLES / "mlp.py")))


# -- experiments across steps --------------------------------------------------------------------------------------

def parameters(session: Session) -> dict[str, torch.Tensor]:
    return {n: session.tensor(n).clone() for n, v in session.program.values.items() if v.kind == "parameter"}


def test_a_learning_rate_patched_from_step_3_changes_the_losses_after_it_and_undo_restores_every_weight():
    session = launched(CURVE, CURVE_STEPS)
    session.run()
    before = parameters(session)
    patch = named_patch(session.program, "slow", None, optimizer={"lr": 0.01}, from_step=FROM_STEP,
                        model=(str(CURVE), "train_step"))
    assert {session.program.nodes[p.node].step for p in patch.patches} == set(range(FROM_STEP, CURVE_STEPS))
    session.experiments.add("slow", patch)
    curve = session.experiments.measure("slow", nodes=False)["lossCurve"]
    assert [row["step"] for row in curve] == list(range(CURVE_STEPS))
    assert all(row["patched"] == row["original"] for row in curve[:FROM_STEP + 1])  # step 3's loss is before its update
    assert all(row["patched"] != row["original"] for row in curve[FROM_STEP + 1:])
    assert not torch.equal(parameters(session)["p_fit_weight"], before["p_fit_weight"])
    session.experiments.restore()
    assert all(torch.equal(before[n], t) for n, t in parameters(session).items())


@pytest.mark.parametrize("changes, step, words", [
    ({"lr": 0.01}, CURVE_STEPS, f"step 6 is not a step of returns_loss: it runs steps 0 to {CURVE_STEPS - 1}"),
    ({"lr": 0.01}, -1, "step -1 is not a step"),
    ({"learning_rate": 0.01}, 0, "the Adam optimizer has no hyperparameter 'learning_rate' \\(its hyperparameters: lr, "
                                 "betas, eps, weight_decay\\)"),
    ({"lr": "fast"}, 0, r"the Adam optimizer's lr must be a finite number \(0 or above\); got 'fast'"),
    ({"lr": float("nan")}, 0, "lr must be a finite number .*; got nan"),
    ({"betas": [0.9]}, 0, "betas must be a pair of numbers"),
    ({"amsgrad": False}, 0, "amsgrad is a flag: it changes which nodes the update runs; set it in the file"),
    ({"weight_decay": 0.0}, 0, "changes which nodes the update runs, not only their numbers"),
    ({"lr": 0.05}, 0, "the optimizer already has lr=0.05"),
    ({}, 0, "name at least one of the optimizer's hyperparameters"),
], ids=["step-beyond", "step-negative", "unknown", "text", "nan", "one-beta", "flag", "adds-nodes", "same", "none"])
def test_a_bad_optimizer_patch_is_refused_in_words(changes, step, words):
    with pytest.raises(RewindError, match=words):
        named_patch(launched(CURVE, CURVE_STEPS).program, "x", None, optimizer=changes, from_step=step,
                    model=(str(CURVE), "train_step"))


def test_a_patch_from_a_step_of_an_inference_pass_it_does_not_have_is_refused_in_words():
    mlp = program(str(EXAMPLES / "mlp.py"))
    with pytest.raises(RewindError, match="step 1 is not a step of mlp: an inference pass has one step, step 0"):
        named_patch(mlp, "wide", "aten.relu", precision="float64", from_step=1)
    with pytest.raises(RewindError, match="mlp is an inference pass: it has no optimizer"):
        named_patch(mlp, "slow", None, optimizer={"lr": 0.01}, model=(str(EXAMPLES / "mlp.py"), "build"))
    with pytest.raises(RewindError, match="fromStep is for patches of nodes"):
        named_patch(mlp, "e", None, edit={"value": "relu", "index": [0, 0], "set": 0.0}, from_step=0)


def test_addpatch_takes_fromstep_and_optimizer_over_dap_and_measurebranch_returns_the_loss_curve():
    schema = SchemaCheck()
    debugger = Debugger.spawn(schema)
    try:
        debugger.start(CURVE, entry="train_step", steps=CURVE_STEPS)
        listing = debugger.request("addPatch", {"name": "slow", "branch": "slow", "optimizer": {"lr": 0.01},
                                                "fromStep": FROM_STEP})
        nodes = listing["branches"][0]["patches"][0]["nodes"]
        assert {int(re.search(r"_step(\d)$", n["node"]).group(1)) for n in nodes} == set(range(FROM_STEP,
                                                                                               CURVE_STEPS))
        curve = debugger.request("measureBranch", {"branch": "slow", "nodes": False})["lossCurve"]
        assert [r["patched"] == r["original"] for r in curve] == [True] * (FROM_STEP + 1) + [False] * 2
        refusals = {"fromStep": (99, "step 99 is not a step of returns_loss"),
                    "optimizer": ({"momentum": 0.9}, "has no hyperparameter 'momentum'")}
        for field, (value, words) in refusals.items():
            base = {"name": "bad", "optimizer": {"lr": 0.02}} if field == "fromStep" else {"name": "bad"}
            with pytest.raises(DapError, match=words):
                debugger.request("addPatch", {**base, field: value})
        with pytest.raises(DapError, match="fromStep"):
            debugger.request("addPatch", {"name": "bad", "node": "aten.mm", "precision": "float64", "fromStep": "3"})
    finally:
        debugger.close()
    assert schema.failures == []


def test_the_console_patches_the_optimizer_from_a_step_and_measure_shows_the_loss_at_each_step(tmp_path):
    script = tmp_path / "steps.rewind"
    script.write_text(f"patch optimizer lr=0.01 --from-step {FROM_STEP} as slow\nmeasure --outputs\n"
                      "patch precision p_fit_weight float64 --from-step two\nquit\n")
    run = rewind("debug", str(CURVE), "--entry", "train_step", "--steps", str(CURVE_STEPS), "--driver", "torch:cpu",
                 "-x", str(script))
    sections = dict(s.split("\n", 1) for s in run.stdout.split("(rewind) ")[1:])
    assert "added patch 'slow' to branch 'experiment' (installed)" in sections[
        f"patch optimizer lr=0.01 --from-step {FROM_STEP} as slow"]
    measured = sections["measure --outputs"]
    rows = [line.split() for line in measured[measured.index("the loss at each step:"):].splitlines()[2:]
            if line.startswith("  ")]
    assert [r[0] for r in rows] == [str(k) for k in range(CURVE_STEPS)]
    assert [r[3] == "same" for r in rows] == [True] * (FROM_STEP + 1) + [False] * 2
    assert "--from-step takes one step number" in run.stdout + run.stderr
