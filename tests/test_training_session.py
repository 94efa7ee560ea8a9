"""Training steps in the Session: breakpoints in a line's forward, its backward or both; gradients by their
parameter's name; time as (step, tick) with goto_step and a checkpoint at each step's start; a NaN only the backward
makes found in the step it happens in; a loss spike stopped at the end of the step before it, both ways."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch

from checkpoint.trace import PROGRAM, TraceError
from hardware.errors import RewindError
from hardware.frontends.torch_train import load_program
from hardware.session import Direction, FunctionSpec, LaunchOptions, LineSpec, Session
from provenance.hyperparameters import hyperparameter_patches
from tests.conftest import EXAMPLES, MODELS, line_of, open_session
from tests.test_trace_trust import assert_clear, build, crafted, frames_of

LATE_NAN = MODELS / "training" / "session_late_nan.py"  # a NaN only the backward makes, in step 2 of 3
SPIKE = MODELS / "training" / "session_loss_spike.py"  # step 6 of 8 takes a batch 1000 times too large
BUG = line_of(LATE_NAN, "# BUG")
LOSS_LINE = line_of(LATE_NAN, "return ((safe - target) ** 2).mean()")


@functools.lru_cache(maxsize=None)
def training(path: Path, steps: int):
    return load_program(path, "train_step", steps)


def launched(path: Path, steps: int, **options) -> Session:
    session = Session(None)
    session.launch(LaunchOptions(str(path), entry="train_step", steps=steps, driver="torch:cpu", stop_on_entry=True,
                                 **options), program=training(path, steps))
    session.start()
    return session


@pytest.fixture(scope="module")
def late_nan():
    session = launched(LATE_NAN, 3)
    yield session
    session.close()


@pytest.fixture
def nan_run(late_nan: Session) -> Session:
    """The late-NaN run at tick 0, with no breakpoints and no filters."""
    late_nan.set_line_breakpoints(str(LATE_NAN), [])
    late_nan.set_function_breakpoints([])
    late_nan.set_exception_filters([])
    late_nan.goto(0)
    return late_nan


def phases(session: Session, stops) -> list[tuple[str, int]]:
    return [(session.program.nodes[s.tick].phase, session.program.nodes[s.tick].step) for s in stops]


# -- breakpoints in the forward, the backward, or both ------------------------------------------------------------

def test_a_line_breakpoint_stops_in_its_forward_by_default_its_backward_or_both_when_asked(nan_run):
    program = nan_run.program
    stops = {}
    for mode in (None, "backward", "both"):
        (bp,) = nan_run.set_line_breakpoints(str(LATE_NAN), [LineSpec(BUG, mode=mode)])
        assert bp.verified, bp.message
        stops[mode] = nan_run.breakpoint_stops(0, nan_run.end)
    assert phases(nan_run, stops[None]) == [("forward", 0), ("forward", 1), ("forward", 2)]
    assert phases(nan_run, stops["backward"]) == [("backward", 0), ("backward", 1), ("backward", 2)]
    for stop in stops["backward"]:  # each begins the backward of the line: it differentiates a node of it
        assert program.forward_node(program.nodes[stop.tick]).loc.line == BUG
    assert [s.tick for s in stops["both"]] == sorted(s.tick for s in stops[None] + stops["backward"])
    # the loss line's backward follows its forward at once, yet is an execution of its own
    nan_run.set_line_breakpoints(str(LATE_NAN), [LineSpec(LOSS_LINE, mode="both")])
    loss_stops = nan_run.breakpoint_stops(0, nan_run.step_start(1))
    assert phases(nan_run, loss_stops) == [("forward", 0), ("backward", 0)]
    assert loss_stops[1].tick == loss_stops[0].tick + len([n for n in program.nodes[:program.step_starts[1]]
                                                            if n.phase == "forward" and n.loc.line == LOSS_LINE])
    nan_run.set_line_breakpoints(str(LATE_NAN), [])
    nan_run.goto(loss_stops[0].tick)
    assert nan_run.step().tick == loss_stops[1].tick  # `next` over the line's forward stops at its backward


def test_continuing_to_a_backward_breakpoint_says_the_mode_the_step_and_the_forward_node(nan_run):
    nan_run.set_line_breakpoints(str(LATE_NAN), [LineSpec(BUG, mode="backward")])
    nan_run.goto_step(1)
    stop = nan_run.run()
    node = nan_run.program.nodes[stop.tick]
    assert (node.phase, node.step) == ("backward", 1)
    assert re.fullmatch(rf"breakpoint \d+ at session_late_nan.py:{BUG} \(backward\) \(step 1, tick {stop.tick}\)",
                        stop.description)
    top = nan_run.frames()[0]
    assert top.name.startswith(f"grad of {nan_run.program.forward_node(node).name}: ") and top.name.endswith("(step 1)")
    assert (top.file, top.line) == (str(LATE_NAN), BUG)


def test_a_function_breakpoint_in_backward_mode_stops_where_its_nodes_are_differentiated(nan_run):
    program = nan_run.program
    (bp,) = nan_run.set_function_breakpoints([FunctionSpec("aten.log", mode="backward")])
    stops = nan_run.breakpoint_stops(0, nan_run.end)
    assert bp.verified and phases(nan_run, stops) == [("backward", 0), ("backward", 1), ("backward", 2)]
    assert all(program.forward_node(program.nodes[s.tick]).op_short == "aten.log" for s in stops)
    (bp,) = nan_run.set_function_breakpoints([FunctionSpec("aten.log")])  # the launch's mode: forward
    assert phases(nan_run, nan_run.breakpoint_stops(0, nan_run.end)) == [("forward", 0), ("forward", 1),
                                                                         ("forward", 2)]


def test_the_launchs_breakpoint_mode_is_every_breakpoints_default():
    session = launched(LATE_NAN, 3, breakpoint_mode="backward")
    (bp,) = session.set_line_breakpoints(str(LATE_NAN), [LineSpec(BUG)])
    stop = session.run()
    assert bp.verified and session.program.nodes[stop.tick].phase == "backward" and "(backward)" in stop.description
    session.close()


@pytest.mark.parametrize("mode, line, words", [
    ("sideways", BUG, "breakpoint mode 'sideways' is not one of forward, backward, both"),
    (3, BUG, "breakpoint mode '3' is not one of forward, backward, both"),
    ("backward", line_of(LATE_NAN, "target = y.clamp"),
     "runs no backward node (nothing it computes is differentiated)"),
], ids=["unknown-mode", "a-number", "line-with-no-backward"])
def test_a_breakpoint_with_a_mode_it_cannot_keep_is_unverified_with_the_reason(nan_run, mode, line, words):
    (bp,) = nan_run.set_line_breakpoints(str(LATE_NAN), [LineSpec(line, mode=mode)])
    assert not bp.verified and words in bp.message
    assert_clear(bp.message)


def test_backward_breakpoints_on_an_inference_pass_are_unverified_and_a_bad_launch_mode_is_refused():
    session = open_session(EXAMPLES / "mlp.py")
    relu_line = line_of(EXAMPLES / "mlp.py", "h = torch.relu")
    line, both = session.set_line_breakpoints(str(EXAMPLES / "mlp.py"), [LineSpec(relu_line, mode="backward"),
                                                                        LineSpec(relu_line, mode="both")])
    (function,) = session.set_function_breakpoints([FunctionSpec("aten.relu", mode="backward")])
    for bp in (line, function):
        assert not bp.verified and "this program has none (an inference pass)" in bp.message
    assert both.verified  # both is the forward too
    with pytest.raises(RewindError, match="breakpoint mode 'upward' is not one of forward, backward, both"):
        session.launch(LaunchOptions(str(EXAMPLES / "mlp.py"), driver="torch:cpu", breakpoint_mode="upward"))
    assert session.program is not None  # the refused launch left the loaded one as it was
    with pytest.raises(RewindError, match="one inference pass, with no training steps"):
        session.goto_step(0)
    with pytest.raises(RewindError, match="one inference pass, with no gradients"):
        session.evaluate("grad(fc1.weight)")
    session.close()


# -- a NaN only the backward makes -------------------------------------------------------------------------------

def test_a_backward_only_nan_stops_at_its_backward_node_naming_the_forward_line_and_the_step(nan_run):
    nan_run.set_exception_filters(["nan"])
    stop = nan_run.run()
    program = nan_run.program
    writer = program.nodes[stop.tick - 1]
    assert stop.reason == "exception" and (writer.phase, writer.step) == ("backward", 2)  # the first step it happens
    forward = program.forward_node(writer)
    assert forward.op_short == "aten.log" and writer.loc.line == BUG
    assert (f"by {writer.op} ('{writer.name}') at {LATE_NAN}:{BUG}, in the backward of {forward.name} "
            f"(step 2, tick {stop.tick})") in stop.description
    assert nan_run.exception_info().context == f"in the backward of {forward.name}"
    top = nan_run.frames()[0]  # the writer, which has run
    assert top.name == f"grad of {forward.name}: {writer.name} (after write) ({writer.op_short}) [<root>] (step 2)"
    assert bool(torch.isfinite(nan_run.tensor(program.losses[2], stop.tick)))  # the forward's loss is finite


# -- gradients by their parameter's name ---------------------------------------------------------------------------

def test_gradients_are_named_by_their_parameter_in_the_step_shown_and_located_like_any_value(nan_run):
    nan_run.goto_step(1)
    assert nan_run.gradients() == {"scale": "grad_p_scale_step1"}
    nan_run.goto(nan_run.step_start(2) - 1)  # step 1's last node is about to run: its gradient is written
    grad = nan_run.tensor("grad_p_scale_step1")
    for written in ("grad(scale)", "grad(model.scale)", "grad($p_scale)", "grad(p_scale)"):
        assert torch.equal(nan_run.evaluate(written), grad), written
    assert nan_run.evaluate("grad(scale).abs().sum() > 0").item()
    assert nan_run.resolve_name("grad(scale)") == "grad_p_scale_step1"
    assert nan_run.provenance(nan_run.resolve_name("grad(scale)"))["lastWriter"]["value"] == "grad_p_scale_step1"
    assert nan_run.locate(nan_run.resolve_name("grad(scale)")).shards[0].nbytes == grad.numel() * 4
    nan_run.goto_step(1)
    with pytest.raises(RewindError, match=r"name 'grad\(scale\)' \(grad_p_scale_step1\) is not written yet"):
        nan_run.evaluate("grad(scale)")  # in step 1's forward


@pytest.mark.parametrize("expression, words", [
    ("grad(scael)", "'scael' is not a parameter of the model; did you mean scale?"),
    ("grad(x)", "'x' is not a parameter of the model (its parameters: scale)"),
    ("grad(x + 1)", "grad() takes one parameter, by its module path or name, as in grad(l1.weight)"),
    ("grad(scale, 2)", "grad() takes one parameter"),
    ("grad(scale.__class__)", "grad() takes one parameter"),
])
def test_a_gradient_of_something_that_is_no_parameter_is_refused_in_words(nan_run, expression, words):
    nan_run.goto(nan_run.end)
    with pytest.raises(RewindError, match=re.escape(words)) as refused:
        nan_run.evaluate(expression)
    assert_clear(str(refused.value))


def test_an_optimizer_node_reads_as_its_update_of_a_parameter_in_its_step(nan_run):
    program = nan_run.program
    update = next(n for n in program.nodes if n.phase == "optimizer" and n.step == 1)
    nan_run.goto(update.index)
    assert nan_run.frames()[0].name == f"SGD update of scale (step 1): {update.name} ({update.op_short})"


# -- steps on the time axis -----------------------------------------------------------------------------------------

def test_goto_step_goes_to_the_first_node_of_a_step_and_refuses_steps_the_run_does_not_have(nan_run):
    program = nan_run.program
    stop = nan_run.goto_step(2)
    assert stop.tick == nan_run.position == program.step_starts[2]
    assert stop.description == f"start of step 2 (step 2, tick {stop.tick})"
    for step in (-1, 3, "2", True, 1.5):
        with pytest.raises(RewindError, match=r"is not a step of this run: its steps are 0\.\.2") as refused:
            nan_run.goto_step(step)
        assert_clear(str(refused.value))
    assert nan_run.position == stop.tick  # refused: nothing moved


def test_timeline_entries_carry_their_step_and_phase_and_the_steps_their_first_tick_and_loss(nan_run):
    program = nan_run.program
    entries = nan_run.timeline_entries(0, nan_run.end)
    assert [(e["step"], e["phase"]) for e in entries] == [(n.step, n.phase) for n in program.nodes]
    assert nan_run.steps() == [{"step": k, "tick": program.step_starts[k], "loss": program.losses[k]}
                               for k in range(3)]


def test_a_checkpoint_holds_each_step_start_and_the_ring_stays_within_its_budget_over_many_steps(spike):
    budget_mb = 0.0005  # about 500 bytes: the ring evicts, then thins its checkpoints
    session = launched(SPIKE, 8, budget_mb=budget_mb)
    assert session.run().reason == "end"
    tl, program = session.tl, session.program
    assert tl.ring.peak <= tl.ring.budget == int(budget_mb * 2**20)
    listed = {c["tick"] for c in session.checkpoints()}
    assert {session.step_start(k) for k in range(8)} <= listed
    assert any(cp.thinned for cp in tl.ring.checkpoints.values())  # thinned, as the ring thins any checkpoint
    per_step = len(program.buffer_mutations) // 8  # the parameters and optimizer state a step updates
    assert len(tl.store.frontier_values) <= per_step + len(program.losses)  # not every step's update
    spike.run()  # the same run, recorded with room to spare
    for k in (1, 4, 7):  # each step starts from the parameters and state the step before left, thinned or not
        for name in ("p_fit_weight", "exp_avg_sq_p_fit_bias"):
            assert torch.equal(session.tensor(name, session.step_start(k)), spike.tensor(name, spike.step_start(k)))
    session.close()


# -- the loss spike ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spike():
    session = launched(SPIKE, 8)
    yield session
    session.close()


def test_a_loss_spike_stops_at_the_end_of_the_step_before_it_forward_and_reverse_from_the_end(spike):
    spike.set_exception_filters(["loss-spike"])
    spike.goto(0)
    stop = spike.run()
    assert (stop.reason, stop.tick) == ("exception", spike.step_start(6))
    assert stop.description.startswith("loss spike: the loss of step 6 (")
    assert stop.description.endswith(f"stopped at the start of step 6, the end of step 5 (step 6, tick {stop.tick})")
    evidence = stop.exception.evidence
    assert evidence["step"] == 6 and evidence["ratio"] > 1e4 and evidence["k"] == 10
    assert spike.run().reason == "end"  # the steps after it are no spike: Adam's update is bounded
    back = spike.run(Direction.REVERSE)
    assert (back.reason, back.tick) == ("exception", stop.tick)
    spike.set_exception_filters(["loss-spike"], {"loss-spike": "k=1e6"})  # 4e5 times the median is no spike now
    spike.goto(0)
    assert spike.run().reason == "end"


@pytest.mark.parametrize("filters, conditions, words", [
    (["loss-spike"], {"loss-spike": "k=0"}, "'k=0' is not k=N with N a number above 0"),
    (["loss-spike"], {"loss-spike": "k=-3"}, "'k=-3' is not k=N"),
    (["loss-spike"], {"loss-spike": "k=many"}, "'k=many' is not k=N"),
    (["loss-spike"], {"loss-spike": "median=5"}, "'median=5' is not k=N"),
    (["loss-spike"], {"loss-spike": 5}, "condition a int is not k=N"),
    (["loss-spike"], {"loss-spike": "k=inf"}, "'k=inf' is not k=N"),
    (["nan"], {"nan": "k=5"}, "the exception filter 'nan' takes no condition (only loss-spike does: k=N)"),
    (["spikes"], {}, "unknown exception filter(s): spikes"),
], ids=["zero", "negative", "words", "other-key", "a-number", "infinite", "nan-with-condition", "unknown"])
def test_a_bad_loss_spike_condition_is_refused_in_words(spike, filters, conditions, words):
    with pytest.raises(RewindError, match=re.escape(words)) as refused:
        spike.set_exception_filters(filters, conditions)
    assert_clear(str(refused.value))


# -- traces keep the optimizer ---------------------------------------------------------------------------------------

def test_a_training_trace_keeps_its_optimizer_and_refuses_one_that_is_no_class_name(late_nan, tmp_path):
    path = tmp_path / "late_nan.rwtrace"
    late_nan.save_trace(str(path))
    reopened = Session(None)
    reopened.launch(LaunchOptions(trace=str(path)))
    assert reopened.program.optimizer == "SGD"
    reopened.close()
    for bad in (3, "os.system", "x" * 300):
        changed = tmp_path / "crafted.rwtrace"
        changed.write_bytes(build(crafted(frames_of(path.read_bytes()), PROGRAM, lambda p: {**p, "optimizer": bad})))
        with pytest.raises(TraceError, match="the program's optimizer .* is not the name of a class"):
            Session(None).launch(LaunchOptions(trace=str(changed)))


def test_undoing_a_hyperparameter_branch_puts_the_last_parameters_back_without_recomputing_them(spike):
    spike.run()
    tl = spike.tl
    before = {name: spike.tensor(name) for name in ("p_fit_weight", "exp_avg_sq_p_fit_bias")}
    recomputed = tl.recomputed
    branch = tl.branch(hyperparameter_patches(spike.program, str(SPIKE), "train_step", {"lr": 1e-4}, first=5))
    tl.seek(tl.end)
    assert not torch.equal(spike.tensor("p_fit_weight"), before["p_fit_weight"])  # the branch trained otherwise
    tl.unbranch(branch)
    assert tl.position == tl.end and tl.recomputed == recomputed  # put back, not recomputed from step 5
    for name, value in before.items():
        assert torch.equal(spike.tensor(name), value)
