"""Training steps through the wire and the console: breakpoints in a line's backward (a SourceBreakpoint's `mode`,
the launch's `breakpointMode`), the Gradients scope and grad(...) names, gotoStep and the timeline's steps, a NaN
only the backward makes, and a loss spike found forward and by reverseContinue from the end."""

from __future__ import annotations

import json
import re

import pytest

from dap_server.client import DapError
from tests.dap.wire import MODELS, Debugger, line_of, named, rewind

LATE_NAN = MODELS / "training" / "session_late_nan.py"  # a NaN only the backward makes, in step 2 of 3
SPIKE = MODELS / "training" / "session_loss_spike.py"  # step 6 of 8 takes a batch 1000 times too large
NAN_LINES = LATE_NAN.read_text().splitlines()
BUG = line_of("# BUG", NAN_LINES)
LABELS = line_of("target = y.clamp", NAN_LINES)  # runs no backward node


def entry_at(debugger: Debugger, tick: int) -> dict:
    return debugger.request("timeline", {"start": tick, "count": 1})["ticks"][0]


@pytest.fixture(scope="module")
def trainer(schema):
    """A server with session_late_nan.py's three training steps loaded, stopped on entry."""
    debugger = Debugger.spawn(schema)
    stop = debugger.start(LATE_NAN, entry="train_step", steps=3, stopOnEntry=True)
    assert stop["reason"] == "entry"
    yield debugger
    debugger.close()


@pytest.fixture
def at_entry(trainer: Debugger) -> Debugger:
    trainer.reset(LATE_NAN)
    trainer.request("setExceptionBreakpoints", {"filters": []})
    return trainer


def test_a_backward_breakpoint_stops_in_the_backward_and_says_the_mode_and_the_step(at_entry):
    backward, sideways, labels = at_entry.set_breakpoints(LATE_NAN, [
        {"line": BUG, "mode": "backward"}, {"line": BUG, "mode": "sideways"}, {"line": LABELS, "mode": "backward"}])
    assert backward["verified"] and backward["line"] == BUG
    assert not sideways["verified"] and "breakpoint mode 'sideways' is not one of forward, backward, both" in \
        sideways["message"]
    assert not labels["verified"] and "runs no backward node" in labels["message"]
    only_backward, log = at_entry.request("setFunctionBreakpoints", {"breakpoints": [
        {"name": "log_backward"}, {"name": "aten.log", "mode": "backward"}]})["breakpoints"]
    assert not only_backward["verified"] and "runs only in the backward: use mode backward or both" in \
        only_backward["message"]
    assert log["verified"]
    at_entry.request("setFunctionBreakpoints", {"breakpoints": []})
    stop = at_entry.motion("continue")
    tick = at_entry.position()
    assert stop["reason"] == "breakpoint" and stop["hitBreakpointIds"] == [backward["id"]]
    assert stop["description"] == f"breakpoint {backward['id']} at session_late_nan.py:{BUG} (backward) " \
                                  f"(step 0, tick {tick})"
    top = at_entry.top()
    assert top["name"].startswith("grad of ") and top["name"].endswith("(step 0)") and top["line"] == BUG
    assert entry_at(at_entry, tick)["phase"] == "backward"


def test_a_nan_only_the_backward_makes_names_the_backward_node_the_forward_line_and_the_step(at_entry):
    at_entry.request("setExceptionBreakpoints", {"filters": ["nan"]})
    stop = at_entry.motion("continue")
    tick = at_entry.position()
    assert stop["reason"] == "exception"
    assert re.search(rf"by aten\.div\.Tensor \('log_backward_step2'\) at {re.escape(str(LATE_NAN))}:{BUG}, in the "
                     rf"backward of log_step2 \(step 2, tick {tick}\)$", stop["description"]), stop["description"]
    info = at_entry.request("exceptionInfo", {"threadId": 1})
    assert info["details"]["node"] == "log_backward_step2" and "in the backward of log_step2" in info["description"]
    assert at_entry.top()["name"].startswith("grad of log_step2: log_backward_step2 (after write)")


def test_the_gradients_scope_round_trips_through_evaluate_locate_and_data_breakpoints(at_entry):
    end = at_entry.request("timeline", {"count": 0})["end"]
    at_entry.motion("goto", {"threadId": 1, "targetId": end + 1})
    gradients = at_entry.scope("Gradients")
    shown = named(gradients, "grad(scale)")
    assert shown["evaluateName"] == "grad(scale)" and shown["type"] == "gradient float32[4]"
    again = at_entry.evaluate(shown["evaluateName"])
    assert again["result"] == shown["value"]
    assert at_entry.request("locate", {"name": "grad(scale)"})["value"] == "grad_p_scale_step2"
    assert at_entry.request("provenance", {"name": "grad(scale)"})["lastWriter"]["value"] == "grad_p_scale_step2"
    ref = next(s for s in at_entry.request("scopes", {"frameId": 1})["scopes"] if s["name"] == "Gradients")
    info = at_entry.request("dataBreakpointInfo", {"name": "grad(scale)",
                                                   "variablesReference": ref["variablesReference"]})
    assert info["dataId"] == "grad_p_scale_step2"
    with pytest.raises(DapError, match=r"'scael' is not a parameter of the model; did you mean scale\?"):
        at_entry.evaluate("grad(scael)")


def test_goto_step_and_the_timeline_speak_in_steps(at_entry):
    steps = at_entry.request("timeline", {"count": 0})["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2] and [s["loss"] for s in steps] == ["loss", "loss_step1",
                                                                                     "loss_step2"]
    stop = at_entry.motion("gotoStep", {"step": 1})
    assert stop["reason"] == "goto" and at_entry.position() == steps[1]["tick"]
    assert stop["description"] == f"start of step 1 (step 1, tick {steps[1]['tick']})"
    entry = entry_at(at_entry, steps[1]["tick"])
    assert (entry["step"], entry["phase"]) == (1, "forward")
    refusals = {3: r"step 3 is not a step of this run: its steps are 0\.\.2", -1: "step -1 is not a step",
                "1": "field 'step'"}
    for step, words in refusals.items():
        with pytest.raises(DapError, match=words):
            at_entry.request("gotoStep", {"threadId": 1, "step": step})
    with pytest.raises(DapError, match="wrongField"):
        at_entry.request("gotoStep", {"threadId": 1, "step": 1, "wrongField": 1})
    assert at_entry.position() == steps[1]["tick"]


def test_loss_spike_conditions_and_a_launch_mode_are_checked_one_by_one(at_entry):
    answers = at_entry.request("setExceptionBreakpoints", {"filters": [], "filterOptions": [
        {"filterId": "loss-spike", "condition": "k=0"}, {"filterId": "loss-spike", "condition": "k=abc"},
        {"filterId": "nan", "condition": "k=5"}, {"filterId": "loss-spike", "condition": "k=5"}]})["breakpoints"]
    assert [a["verified"] for a in answers] == [False, False, False, True]
    assert "'k=0' is not k=N with N a number above 0" in answers[0]["message"]
    assert "the exception filter 'nan' takes no condition" in answers[2]["message"]
    with pytest.raises(DapError, match="breakpointMode"):
        at_entry.request("restart", {"arguments": {"program": str(LATE_NAN), "entry": "train_step", "steps": 3,
                                                   "driver": "torch:cpu", "breakpointMode": "sideways"}})
    assert at_entry.position() == 0  # the refused restart left the run as it was


def test_a_loss_spike_stops_at_the_end_of_the_step_before_and_reverse_continue_lands_there(trainer):
    """Last in the module: the server goes on with the loss-spike model."""
    trainer.request("setExceptionBreakpoints", {"filters": [], "filterOptions": [{"filterId": "loss-spike",
                                                                                  "condition": "k=100"}]})
    stop = trainer.motion("restart", {"arguments": {"program": str(SPIKE), "entry": "train_step", "steps": 8,
                                                    "driver": "torch:cpu", "breakpointMode": "both"}})
    assert stop["reason"] == "exception"
    spike_start = trainer.request("timeline", {"count": 0})["steps"][6]["tick"]
    assert trainer.position() == spike_start and stop["description"].startswith("loss spike: the loss of step 6")
    info = trainer.request("exceptionInfo", {"threadId": 1})
    assert info["details"]["typeName"] == "LossSpike" and info["details"]["evidence"]["step"] == 6
    assert info["details"]["evidence"]["k"] == 100
    assert trainer.motion("continue")["reason"] == "end"
    back = trainer.motion("reverseContinue")
    assert back["reason"] == "exception" and trainer.position() == spike_start


def test_the_console_breaks_in_the_backward_goes_to_a_step_and_prints_a_gradient():
    script = (f"break {BUG} backward\ncontinue\ngoto step 2\ngoto step 3\ndelete 1\ncontinue\ncontinue\n"
              "print grad(scale).shape\nquit\n")
    run = rewind("debug", str(LATE_NAN), "--entry", "train_step", "--steps", "3", "--json", stdin=script)
    records = {r["command"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert records[f"break {BUG} backward"]["result"]["mode"] == "backward"
    stops = [json.loads(line) for line in run.stdout.splitlines() if json.loads(line)["command"] == "continue"]
    assert "(backward) (step 0, tick" in stops[0]["result"]["description"]
    assert stops[1]["result"]["reason"] == "exception" and "in the backward of log_step2" in \
        stops[1]["result"]["description"]
    assert stops[2]["result"]["reason"] == "end"
    assert records["goto step 2"]["result"]["description"].startswith("start of step 2 (step 2, tick ")
    assert not records["goto step 3"]["ok"] and "its steps are 0..2" in records["goto step 3"]["error"]
    assert records["print grad(scale).shape"]["result"]["result"] == "torch.Size([4])"
    assert run.returncode == 1  # one command failed: goto step 3


# -- training steps as people write them (tests/test_training_as_written.py has the Python API's side) -----------

ONE_HOT = MODELS / "training" / "one_hot_loss.py"
CLOSURE = MODELS / "training" / "closure_loss.py"
DROPOUT = MODELS / "training" / "dropout_noise.py"
SHOWN = {"rel": 1e-4, "abs": 1e-5}  # an answer shows 5 digits


def launched_over_the_wire(schema, program, **launch) -> tuple[Debugger, list[str]]:
    """A server that launched `program` and ran it to its end; the output events of its launch."""
    debugger = Debugger.spawn(schema)
    stop = debugger.start(program, stopOnEntry=True, **launch)
    assert stop["reason"] == "entry"
    said = [m["body"]["output"] for m in debugger.messages if m.get("event") == "output"]
    assert debugger.motion("continue")["reason"] == "end"
    return debugger, said


def test_a_one_hot_loss_runs_over_the_wire_and_its_losses_are_eager_torchs(schema):
    from tests.test_training_as_written import eager_steps
    debugger, _ = launched_over_the_wire(schema, ONE_HOT, entry="train_step", steps=3)
    try:
        eager, _ = eager_steps(ONE_HOT)
        for k, (loss, _) in enumerate(eager):
            assert debugger.number("loss" + (f"_step{k}" if k else "")) == pytest.approx(loss.item(), **SHOWN)
    finally:
        debugger.close()


def test_a_file_of_train_step_alone_with_a_closure_loss_launches_without_an_entry_and_says_so(schema):
    from tests.test_training_as_written import eager_steps
    debugger, said = launched_over_the_wire(schema, CLOSURE, steps=3)  # no entry: the default, build, is not there
    try:
        assert [s for s in said if "train_step" in s] == [
            "closure_loss.py defines train_step() and no build(): running its training step (entry train_step)\n"]
        eager, _ = eager_steps(CLOSURE, closure=True)
        assert debugger.number("loss_step2") == pytest.approx(eager[2][0].item(), **SHOWN)
    finally:
        debugger.close()


def test_dropout_over_the_wire_draws_eager_torchs_numbers_and_the_same_mask_back_and_forth(schema):
    from tests.test_training_as_written import eager_steps, training
    debugger, _ = launched_over_the_wire(schema, DROPOUT, entry="train_step", steps=3)
    try:
        _, dropped = eager_steps(DROPOUT, seen="drop")
        node = next(n for n in training(DROPOUT).nodes if n.name == "seeded_native_dropout_step1")  # the module's
        output, mask = node.outputs[:2]
        timeline = debugger.request("timeline", {"start": 0, "count": 1000})["ticks"]
        tick = next(t["tick"] for t in timeline if t["node"] == node.name)
        debugger.motion("goto", {"threadId": 1, "targetId": tick + 2})  # just after it (a target is a tick + 1)
        assert debugger.position() == tick + 1
        drawn = debugger.evaluate(f"{mask}.sum()")["result"], debugger.number(f"{output}.sum()")
        assert drawn[1] == pytest.approx(dropped[1].sum().item(), **SHOWN)
        one = {"threadId": 1, "granularity": "instruction"}
        debugger.motion("stepBack", one)
        assert debugger.position() == tick
        debugger.motion("next", one)
        assert debugger.position() == tick + 1
        assert (debugger.evaluate(f"{mask}.sum()")["result"], debugger.number(f"{output}.sum()")) == drawn
        debugger.motion("goto", {"threadId": 1, "targetId": 1})
        debugger.motion("goto", {"threadId": 1, "targetId": tick + 2})  # replayed from a checkpoint
        assert (debugger.evaluate(f"{mask}.sum()")["result"], debugger.number(f"{output}.sum()")) == drawn
    finally:
        debugger.close()


def test_a_step_that_cannot_be_traced_is_refused_over_the_wire_at_the_users_line_in_words(schema, tmp_path):
    from tests.test_training_as_written import step_file
    path = step_file(tmp_path, "model.l.weight.register_hook(lambda g: g if g.sum() > 0 else -g)")
    debugger = Debugger.spawn(schema)
    try:
        debugger.initialize()
        with pytest.raises(DapError) as caught:
            debugger.request("launch", {"program": str(path), "entry": "train_step", "driver": "torch:cpu"})
        message = caught.value.message
        assert "model.py:17 `model.l.weight.register_hook(lambda g: g if g.sum() > 0 else -g)` reads a tensor's " \
               "value" in message
        assert "Traceback" not in message and "Error" not in message
    finally:
        debugger.close()


def test_the_console_runs_a_file_of_train_step_alone_says_which_entry_and_prints_its_losses():
    from tests.test_training_as_written import eager_steps
    run = rewind("debug", str(CLOSURE), "--driver", "torch:cpu", "--steps", "2",
                 stdin="continue\nprint loss_step1\nquit\n")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "closure_loss.py defines train_step() and no build(): running its training step (entry " \
                       "train_step)"
    eager, _ = eager_steps(CLOSURE, closure=True)
    shown = next(line for line in lines if line.startswith("loss_step1 = "))
    assert float(shown.rsplit("=", 1)[1]) == pytest.approx(eager[1][0].item(), **SHOWN)
    assert "Traceback" not in run.stdout + run.stderr


# -- what a loop does around its step: a scheduler, accumulation, a GradScaler (tests/test_training_options.py and
# tests/test_training_grad_scaler.py have the Python API's side) ---------------------------------------------------

SCHEDULE = MODELS / "training" / "planted_lr_schedule.py"  # StepLR's gamma of 10: the loss climbs from step 4
ACCUMULATE = MODELS / "training" / "accumulate_micro_batches.py"  # 4 micro-batches a step
OVERFLOW = MODELS / "training" / "planted_grad_scaler_overflow.py"  # GradScaler skips every step
LOOP_STEPS = 6


def test_a_schedulers_learning_rate_is_printed_per_step_and_patched_from_step_k_over_the_wire(schema):
    from tests.test_training_options import eager_loop
    debugger, _ = launched_over_the_wire(schema, SCHEDULE, entry="train_step", steps=LOOP_STEPS)
    try:
        eager = eager_loop(SCHEDULE, LOOP_STEPS)
        assert [debugger.number("lr" + (f"_step{k}" if k else "")) for k in range(LOOP_STEPS)] == \
            [step["lr"][0] for step in eager]
        added = debugger.request("addPatch", {"name": "calm", "optimizer": {"lr": 0.005}, "fromStep": 4})
        patched = added["branches"][0]["patches"][0]["nodes"]
        assert [n["node"] for n in patched] == ["lr_step4", "lr_step5"]
        curve = debugger.request("measureBranch", {"branch": "experiment", "nodes": False})["lossCurve"]
        assert [row["patched"] == row["original"] for row in curve] == [True] * 5 + [False]
        assert curve[-1]["patched"] < curve[-1]["original"] / 10
        with pytest.raises(DapError, match="lr must be a finite number"):
            debugger.request("addPatch", {"name": "bad", "optimizer": {"lr": "fast"}, "fromStep": 4})
    finally:
        debugger.close()


def test_accumulation_over_4_micro_batches_over_the_wire_has_eager_losses_and_each_micro_batch_as_a_value(schema):
    from tests.test_training_options import eager_loop
    debugger, _ = launched_over_the_wire(schema, ACCUMULATE, entry="train_step", steps=3)
    try:
        for k, step in enumerate(eager_loop(ACCUMULATE, 3)):
            assert debugger.number("loss" + (f"_step{k}" if k else "")) == pytest.approx(step["loss"].item(), **SHOWN)
        assert debugger.evaluate("x_micro3_step2.shape")["result"] == "torch.Size([4, 5])"
    finally:
        debugger.close()


def test_a_grad_scalers_skipped_step_is_stepped_to_over_the_wire_and_its_scale_halves(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(OVERFLOW, stopOnEntry=True, entry="train_step", steps=3)["reason"] == "entry"
    try:
        stop = debugger.motion("continue")  # the float16 overflow the scaler will find
        assert stop["reason"] == "exception" and "(step 0, tick" in stop["description"]
        assert entry_at(debugger, debugger.position())["phase"] == "backward"
        debugger.request("setExceptionBreakpoints", {"filters": []})
        assert debugger.motion("continue")["reason"] == "end"
        assert [debugger.number("found_inf" + (f"_step{k}" if k else "")) for k in range(3)] == [1.0] * 3
        assert debugger.number("grad_scale") == 8192.0  # 65536 halved in each of the 3 steps
        timeline = debugger.request("timeline", {"start": 0, "count": 2000})["ticks"]
        tick = next(t["tick"] for t in timeline if t["node"] == "found_inf_step1")
        assert (entry_at(debugger, tick)["phase"], entry_at(debugger, tick)["step"]) == ("optimizer", 1)
        debugger.motion("goto", {"threadId": 1, "targetId": tick + 2})  # just after the check
        assert debugger.position() == tick + 1 and debugger.number("found_inf_step1") == 1.0
        assert debugger.number("grad_scale") == 32768.0  # step 1 runs at the scale step 0 halved
        debugger.motion("stepBack", {"threadId": 1, "granularity": "instruction"})
        with pytest.raises(DapError, match="found_inf_step1"):
            debugger.evaluate("found_inf_step1")  # not yet computed before its node
    finally:
        debugger.close()


def test_the_console_prints_a_steps_learning_rate_and_rewind_forensics_runs_a_scheduled_step():
    run = rewind("debug", str(SCHEDULE), "--entry", "train_step", "--steps", "5", "--driver", "torch:cpu",
                 stdin="continue\nprint lr_step4\npatch optimizer lr=0.005 --from-step 4 as calm\nprint lr_step4\n"
                       "quit\n")
    assert run.returncode == 0, run.stderr
    shown = [line for line in run.stdout.splitlines() if line.startswith("lr_step4 = ")]
    assert [float(s.rsplit("=", 1)[1]) for s in shown] == [pytest.approx(5.0), pytest.approx(0.005)]
    assert "added patch 'calm'" in run.stdout
    forensics = rewind("forensics", str(SCHEDULE), "--entry", "train_step", "--steps", "5", "--driver", "torch:cpu",
                       "--budget-mb", "64", "--no-ablate")
    # A learning rate too large is no numerical error: the float64 reference follows the same schedule, step by step.
    assert forensics.returncode == 0 and "Root cause: clean" in forensics.stdout, forensics.stdout + forensics.stderr
    assert "Traceback" not in run.stdout + run.stderr + forensics.stdout + forensics.stderr


# -- a step the user wrote: their own backward(), clip_grad_norm_ and opt.step() (tests/test_training_user_step.py
# has the Python API's side) ----------------------------------------------------------------------------------------

USER_STEP = MODELS / "training" / "user_step_loop.py"  # train_step(x, y) of its own: micro-batches, clip, AdamW
PLANTED_USER_STEP = MODELS / "training" / "user_step_planted_log.py"  # log of an underflowed probability


def test_a_breakpoint_on_the_users_opt_step_stops_in_each_steps_update_forwards_and_back(schema):
    from tests.test_training_user_step import eager
    lines = USER_STEP.read_text().splitlines()
    step_line, clip_line = line_of("opt.step()", lines), line_of("clip_grad_norm_(model", lines)
    debugger = Debugger.spawn(schema)
    try:
        assert debugger.start(USER_STEP, stopOnEntry=True, steps=3)["reason"] == "entry"  # train_step: the only entry
        said = [m["body"]["output"] for m in debugger.messages if m.get("event") == "output"]
        assert any("running its training step (entry train_step)" in s for s in said)
        clip, step = debugger.set_breakpoints(USER_STEP, [{"line": clip_line}, {"line": step_line}])
        assert clip["verified"] and step["verified"]
        stops = []
        for _ in range(4):
            stop = debugger.motion("continue")
            top = debugger.top()
            stops.append((stop["reason"], top["line"], entry_at(debugger, debugger.position())["phase"]))
        assert stops == [("breakpoint", clip_line, "optimizer"), ("breakpoint", step_line, "optimizer")] * 2
        assert "(step 1, tick" in stop["description"]
        losses, _ = eager(USER_STEP, 2)
        assert debugger.number("loss_step1") == pytest.approx(losses[1], **SHOWN)
        assert debugger.number("lr") == pytest.approx(0.01 / 3, **SHOWN)  # the user's LambdaLR (step 1's: next)
        assert debugger.evaluate("x.shape", frame_id=debugger.top()["id"])["result"] == "torch.Size([8, 6])"  # the step's own variables, at its line
        back = debugger.motion("reverseContinue")
        assert debugger.top()["line"] == clip_line and "(step 1, tick" in back["description"]
        debugger.motion("reverseContinue")
        assert debugger.top()["line"] == step_line
    finally:
        debugger.close()


def test_rewind_forensics_names_the_users_line_in_a_step_of_their_own_and_the_console_prints_its_losses():
    from tests.test_training_user_step import eager
    run = rewind("forensics", str(PLANTED_USER_STEP), "--driver", "torch:cpu", "--steps", "2", "--json")
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout[run.stdout.index("{"):])
    assert f"user_step_planted_log.py:{line_of('# BUG', PLANTED_USER_STEP.read_text().splitlines())}" in \
        report["headline"] and "Inf born" in report["headline"]
    run = rewind("debug", str(USER_STEP), "--driver", "torch:cpu", "--steps", "2",
                 stdin="continue\nprint loss_step1\nquit\n")
    assert run.returncode == 0, run.stderr
    shown = next(line for line in run.stdout.splitlines() if line.startswith("loss_step1 = "))
    assert float(shown.rsplit("=", 1)[1]) == pytest.approx(eager(USER_STEP, 2)[0][1], **SHOWN)
    assert "Traceback" not in run.stdout + run.stderr
