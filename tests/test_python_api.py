"""`import rewind`: the Python API over the engine every surface uses, driven as a script or a notebook would.

Sessions are shared by module fixtures (a launch exports the model): examples/gpt.py's GPT in memory, the
planted softmax overflow from its file, and a training step.
"""

from __future__ import annotations

import inspect
import pydoc

import pytest
import torch

import rewind
from examples.gpt import build
from rewind import RewindError
from tests.conftest import EXAMPLES, MODELS, line_of
from tests.forensics_cases import FORENSICS

GPT = EXAMPLES / "gpt.py"
SOFTMAX_LINE = line_of(GPT, "weights = torch.softmax")
MASK_LINE = line_of(GPT, "scores = scores.masked_fill")


@pytest.fixture(scope="module")
def gpt_model() -> torch.nn.Module:
    model, _ = build()
    return model.train()  # the user's mode, which debugging must leave as it was


@pytest.fixture(scope="module")
def gpt(gpt_model):
    with rewind.debug(gpt_model, build()[1], driver="torch:cpu") as session:
        yield session


@pytest.fixture(scope="module")
def overflow():
    with rewind.debug(FORENSICS / "softmax_overflow.py", driver="torch:cpu", budget_mb=64) as session:
        yield session


def test_a_model_in_memory_stops_at_a_line_and_moves_both_ways(gpt, gpt_model):
    assert gpt_model.training, "exporting the model left it in eval mode"
    assert gpt.last_stop.data["tick"] == 0 and gpt.last_stop.data["reason"] == "entry"
    assert gpt.breakpoint("gpt.py", SOFTMAX_LINE).text == "breakpoint 1 at gpt.py:%d" % SOFTMAX_LINE
    stop = gpt.run()
    assert stop.data["frame"]["line"] == SOFTMAX_LINE and stop.data["breakpoints"]
    assert f"gpt.py:{SOFTMAX_LINE}  weights = torch.softmax(scores, dim=-1)" in repr(stop)
    frames = gpt.where().data["frames"]
    assert [f["name"].split(" ")[0] for f in frames] == ["softmax", "Block.forward", "GPT.forward"]
    after = gpt.step()
    assert after.data["tick"] > stop.data["tick"]
    assert gpt.value("weights").data["stats"]["max"] <= 1.0
    assert gpt.back().data["tick"] == stop.data["tick"]  # back over the softmax: where it was about to run
    assert gpt.run(reverse=True).data["reason"] == "entry"  # no breakpoint before the first softmax
    assert gpt.goto(stop.data["tick"]).data["frame"]["line"] == SOFTMAX_LINE
    assert gpt.delete(1).data == {"deleted": 1} and gpt.breakpoints.text == "no breakpoints"


def at_the_first_softmax(session) -> None:
    _, ticks = session.session.line_positions(str(GPT), SOFTMAX_LINE)
    session.goto(ticks[0])


def test_a_value_shows_its_stats_a_heatmap_and_a_histogram_with_its_infinities_counted(gpt):
    at_the_first_softmax(gpt)
    scores = gpt.value("scores")
    assert repr(scores).startswith("scores = float32[1, 4, 16, 16]") and "inf=480" in repr(scores)
    assert scores.data["stats"]["inf"] == 480 and scores.tensor.shape == (1, 4, 16, 16)
    page = scores._repr_html_()
    assert page.count("data:image/png;base64,") == 2  # heatmap and histogram
    assert "<td>480</td>" in page and "-Inf" in page


def test_locate_prov_history_and_the_timeline_answer_as_the_console(gpt):
    at_the_first_softmax(gpt)
    placed = gpt.locate("scores")
    assert "scores (masked_fill): float32[1, 4, 16, 16] in host of cpu at 0x" in placed.text
    written = gpt.prov("scores")
    assert f"was written by aten.masked_fill.Scalar ('masked_fill') at gpt.py:{MASK_LINE}" in written.text
    assert written.data["lineage"]["roots"]
    assert gpt.history("$masked_fill").data["total"] == 1
    assert "checkpoint" in gpt.timeline().text and gpt.checkpoints().data["checkpoints"]


HOSTILE = [
    (lambda s: s.goto(-1), "tick -1 is outside the run"),
    (lambda s: s.goto(10**9), "outside the run"),
    (lambda s: s.goto("3"), "tick must be a whole number"),
    (lambda s: s.goto(True), "tick must be a whole number, got a bool"),
    (lambda s: s.value("no_such_name"), "'no_such_name' is not defined"),
    (lambda s: s.value("__import__('os')"), "not allowed"),
    (lambda s: s.value(3), "expression must be text"),
    (lambda s: s.locate("no_such_name"), "'no_such_name' is not a variable or value of the program"),
    (lambda s: s.prov("tokens", max_history=-1), "'max_history'"),
    (lambda s: s.breakpoint("gpt.py", 10_000), "no node runs at line 10000"),
    (lambda s: s.breakpoint("nowhere.py", 3), "no file 'nowhere.py'"),
    (lambda s: s.breakpoint("no_such_module"), "no node, op or module path 'no_such_module'"),
    (lambda s: s.breakpoint(f"gpt.py:{SOFTMAX_LINE}", condition="x +"), "syntax error"),
    (lambda s: s.breakpoint(["gpt.py"]), "breakpoint takes a FILE and LINE"),
    (lambda s: s.delete(99), "no breakpoint 99"),
    (lambda s: s.step("sideways"), "kind must be one of over, in, out"),
    (lambda s: s.run(reverse="yes"), "reverse must be True or False"),
    (lambda s: s.stop_on("nan", "boom"), "unknown exception filter(s): boom"),
    (lambda s: s.goto_step(1), "no training steps"),
    (lambda s: s.ablate(), "ablate takes node names, or search=True"),
    (lambda s: s.patch("softmax", precision="float99"), "'float99' is not a floating-point dtype"),
    (lambda s: s.patch("softmax"), "exactly one of precision, function, attributes, edit or optimizer"),
    (lambda s: s.measure(), "name a branch to measure"),
    (lambda s: s.save(3), "path must be text"),
]


@pytest.mark.parametrize("ask, said", HOSTILE, ids=[said for _, said in HOSTILE])
def test_bad_names_ticks_and_types_are_refused_in_words_and_the_session_goes_on(gpt, ask, said):
    with pytest.raises(RewindError) as refused:
        ask(gpt)
    message = str(refused.value)
    assert said in message
    assert not any(word in message for word in ("Error", "Exception", "Traceback"))
    assert gpt.goto(1).data["tick"] == 1  # still debugging


def test_what_cannot_be_debugged_is_refused_before_anything_runs(tmp_path):
    class Unloaded(torch.nn.Module):
        def forward(self, x):
            raise ValueError("the weights are not loaded")

    cases = [(lambda: rewind.debug(Unloaded(), torch.ones(2)), "torch.export failed for Unloaded: the weights are "
                                                               "not loaded"),
             (lambda: rewind.debug(torch.nn.Linear(2, 2)), "was given no inputs"),
             (lambda: rewind.debug(torch.nn.Linear(2, 2), [torch.ones(2)]), "was given inputs of type list"),
             (lambda: rewind.debug(3), "takes a torch.nn.Module and its inputs, or the path of a model file"),
             (lambda: rewind.debug(tmp_path / "missing.py"), "program file not found"),
             (lambda: rewind.debug(GPT, torch.ones(1)), "a model file makes its own inputs"),
             (lambda: rewind.debug(torch.nn.Linear(2, 2), torch.ones(2), driver="tpu"), "unknown driver 'tpu'"),
             (lambda: rewind.debug(torch.nn.Linear(2, 2), torch.ones(2), budget_mb=-1), "budget_mb must be"),
             (lambda: rewind.open(tmp_path / "missing.rwtrace"), "trace file not found"),
             (lambda: rewind.open(tmp_path), "it is a folder")]
    for start, said in cases:
        with pytest.raises(RewindError) as refused:
            start()
        assert said in str(refused.value)


def test_forensics_names_the_root_cause_and_an_experiment_is_measured_and_undone(overflow):
    report = overflow.forensics()
    assert report.problem and report.data["nonfinite"]["pattern"]["pattern"] == "exp-overflow"
    assert "Root cause: " in repr(report) and repr(report).rstrip().endswith("Verdict: problem found")
    page = report._repr_html_()
    assert 'id="growth-chart"' in page and 'id="node-table"' in page and "# BUG" in page
    patched = overflow.patch("exp", precision="float32", name="wide")
    assert patched.data["active"] == "experiment"
    measured = overflow.measure()
    assert measured.data["branch"] == "experiment" and measured.series["original"]
    assert measured._repr_html_().count("data:image/png;base64,") == 1
    assert overflow.compare("experiment").data["branches"] == ["experiment"]
    assert overflow.undo().data["active"] == "original"
    assert overflow.compare().data["rows"] and overflow.first_divergence().data["divergence"]["node"] == "exp"


def test_a_saved_run_reopens_without_the_device_and_serves_as_a_reference(overflow, tmp_path):
    trace = tmp_path / "run.rwtrace"
    assert overflow.save(trace).data["ticks"] == overflow.end
    kept = trace.read_bytes()
    with pytest.raises(RewindError, match="exists and is kept; save\\(path, overwrite=True\\) replaces it"):
        overflow.save(trace)
    assert trace.read_bytes() == kept
    against_itself = overflow.forensics(reference=str(trace), ablate=False)
    assert against_itself.data["reference"] == str(trace) and against_itself.data["divergence"] is None
    with rewind.open(trace) as replay:
        assert replay.run().data["reason"] == "exception"  # the NaN the recorded run wrote, found again
        assert replay.value("$exp").data["stats"]["inf"] > 0
        assert replay.run(reverse=True).data["tick"] == 0
    with pytest.raises(RewindError, match="this debug session is closed"):
        replay.step()


def test_a_training_step_file_runs_its_steps():
    with rewind.debug(MODELS / "training" / "mlp_sgd.py", entry="train_step", steps=2, driver="torch:cpu") as s:
        stop = s.goto_step(1)
        assert stop.data["tick"] == s.session.step_start(1) and "start of step 1" in stop.text
        assert s.run().data["reason"] == "end"
        assert list(s.value("grad(l1.weight)").tensor.shape) == [8, 4]  # step 1's gradient of the first layer


def test_help_shows_the_usage_and_every_method_is_documented_and_typed():
    text = pydoc.render_doc(rewind)
    assert "s = rewind.debug(model, inputs)" in text and "rewind.open" in text
    public = [(name, f) for name, f in inspect.getmembers(rewind.DebugSession, inspect.isfunction)
              if not name.startswith("_")]
    assert len(public) >= 30
    for name, method in public:
        assert method.__doc__, f"DebugSession.{name} has no docstring"
        assert inspect.signature(method).return_annotation is not inspect.Signature.empty, name
