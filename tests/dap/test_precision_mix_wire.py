"""Numerics on any precision mix through the wire (issue 28): a correct autocast model and a correct 20-step
training run run to the end under the divergence filter, a bug in an autocast region stops at its line, the
autocast casts have the line of the op they feed, and the forensics requests say what could not run."""

from tests.conftest import MODELS, line_of
from tests.dap.test_forensics import load

PRECISION = MODELS / "precision"


def test_a_correct_autocast_model_runs_to_the_end_under_the_divergence_filter(debugger):
    stop = load(debugger, PRECISION / "autocast_clean.py", ["nan", "inf", "divergence"])
    assert stop["reason"] == "end"
    body = debugger.request("firstDivergence", {})
    assert body["divergence"] is None and body["trials"] == []


def test_a_correct_training_run_of_20_steps_is_clean_through_the_wire(debugger):
    stop = load(debugger, PRECISION / "train_tiny_losses.py", ["divergence"], entry="train_step", steps=20)
    assert stop["reason"] == "end"
    table = debugger.request("compareWithReference", {"introduced": True})
    assert all(o["within"] for o in table["outputs"]) and table["trials"] == []


def test_a_bug_in_an_autocast_region_stops_at_its_line(debugger):
    path = PRECISION / "autocast_accumulation.py"
    stop = load(debugger, path, ["divergence"])
    assert stop["reason"] == "exception"
    frame = debugger.top()
    assert frame["line"] == line_of(path, "# BUG") and frame["source"]["path"] == str(path)
    found = debugger.request("firstDivergence", {"origin": False})["divergence"]
    assert found["pattern"]["pattern"] == "low-precision-accumulation"
    assert found["source"]["line"] == line_of(path, "# BUG")


def test_autocast_casts_stop_at_the_line_of_the_op_they_feed(debugger):
    path = PRECISION / "autocast_clean.py"
    load(debugger, path, [], stopOnEntry=True)
    frame = debugger.top()  # the first node is a cast autocast inserted for the first linear
    assert frame["line"] == line_of(path, "h = torch.relu(self.fc1(x))") and "linear_cast" in frame["name"]
