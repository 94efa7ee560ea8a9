"""A training step as a Program: the forward, the backward (each node at the line of the forward op it
differentiates) and the optimizer's update, unrolled over steps; compared with eager torch, stepped through the
Session and the DAP server, and refused in words when the file's train_step() or batches() is wrong."""

from __future__ import annotations

import functools
import itertools
import re
import textwrap
from pathlib import Path

import pytest
import torch

from checkpoint.trace import PROGRAM, TraceError
from dap_server.client import DapError
from hardware.errors import ProgramLoadError
from hardware.frontends.optimizers import rule_of
from hardware.frontends.torch_export import user_file
from hardware.frontends.torch_train import MAX_NODES, MAX_STEPS, load_program
from hardware.optimizer_ops import ADAM_ARGUMENTS, adam_update
from hardware.session import DataSpec, Direction, LaunchOptions, Session
from provenance.reference import open_reference
from tests.conftest import EXAMPLES, MODELS, line_of
from tests.dap.wire import Debugger, SchemaCheck
from tests.test_trace_trust import assert_clear, build, crafted, frames_of

TRAINING = MODELS / "training"
MLP = TRAINING / "mlp_sgd.py"  # SGD with momentum and weight decay; batches() gives each step its own batch
ATTENTION = TRAINING / "attention_adamw.py"  # AdamW
RETURNS_LOSS = TRAINING / "returns_loss.py"  # the forward returns the loss; Adam with amsgrad
NAN_GRADIENT = TRAINING / "nan_gradient.py"
STEPS = 3


@functools.lru_cache(maxsize=None)
def training(path: Path, steps: int = STEPS):
    return load_program(path, "train_step", steps)


@functools.lru_cache(maxsize=None)
def ran(path: Path) -> Session:
    """A Session over the file's training Program, run to its end."""
    session = launched(path)
    assert session.run().reason == "end"
    return session


def launched(path: Path, steps: int = STEPS) -> Session:
    session = Session(None)
    session.launch(LaunchOptions(str(path), entry="train_step", steps=steps, driver="torch:cpu", stop_on_entry=True),
                   program=training(path, steps))
    session.start()
    return session


def eager_steps(path: Path, steps: int = STEPS, dtype: torch.dtype = torch.float32):
    """The file's training loop in eager torch: the loss of each step and the parameters after it."""
    with user_file(path) as module:  # imported as Rewind imports it: its folder on the import path
        model, inputs, *loss_fn, optimizer = module.train_step()
        batches = list(itertools.islice(module.batches(), steps)) if hasattr(module, "batches") else [inputs] * steps
    model.to(dtype)  # in place: the optimizer holds the same parameters, widened
    batches = iter(batches)
    out = []
    for _ in range(steps):
        batch = [t.to(dtype) if t.is_floating_point() else t for t in next(batches)]
        optimizer.zero_grad()
        loss = loss_fn[0](model(*batch[:-1]), batch[-1]) if loss_fn else model(*batch)
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
        out.append((loss.detach(), grads, {name: p.detach().clone() for name, p in model.named_parameters()}))
    return out


def value(name: str) -> str:
    """The Program value of a module attribute: `l1.weight` is `p_l1_weight`."""
    return "p_" + name.replace(".", "_")


def updated(name: str, step: int) -> str:
    return f"{value(name)}_updated" + (f"_step{step}" if step else "")


# -- the numbers are eager torch's ------------------------------------------------------------------------------

def test_the_joint_graphs_gradients_equal_eager_backward():
    session, program = ran(ATTENTION), training(ATTENTION)
    for step, (_, grads, _) in enumerate(eager_steps(ATTENTION)):
        for name, grad in grads.items():
            torch.testing.assert_close(session.tensor(program.gradients[step][value(name)]), grad, rtol=1e-6,
                                       atol=1e-8)


@pytest.mark.parametrize("path", [MLP, ATTENTION, RETURNS_LOSS], ids=["sgd", "adamw", "adam-returns-loss"])
def test_parameters_after_one_and_three_steps_equal_an_eager_loop(path):
    session, program = ran(path), training(path)
    for step, (loss, _, params) in enumerate(eager_steps(path)):
        torch.testing.assert_close(session.tensor(program.losses[step]), loss, rtol=1e-6, atol=1e-8)
        for name, param in params.items():
            torch.testing.assert_close(session.tensor(updated(name, step)), param, rtol=1e-6, atol=1e-8)
    for name, param in params.items():  # the parameter value itself holds the last update
        torch.testing.assert_close(session.tensor(value(name)), param, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind, options", [(torch.optim.AdamW, {"weight_decay": 0.1}),
                                           (torch.optim.Adam, {"weight_decay": 0.05, "maximize": True})],
                         ids=["adamw", "adam-l2-maximize"])
def test_an_adam_update_node_is_torch_optims_update_bit_for_bit(kind, options):
    torch.manual_seed(0)
    eager = torch.nn.Parameter(torch.randn(5, 7))
    optimizer = kind([eager], lr=3e-3, **options)
    hyper = rule_of(optimizer).hyper(optimizer.param_groups[0])
    param, state = eager.detach().clone(), {"exp_avg": torch.zeros(5, 7), "exp_avg_sq": torch.zeros(5, 7),
                                            "step": torch.tensor(0.0)}
    for _ in range(3):
        grad = torch.randn(5, 7)
        eager.grad = grad.clone()
        optimizer.step()
        param, *moments, step = adam_update(param, grad, state["exp_avg"], state["exp_avg_sq"], state["step"],
                                            torch.tensor(hyper["lr"], dtype=torch.float64),
                                            *(hyper[k] for k in ADAM_ARGUMENTS))
        state = dict(zip(("exp_avg", "exp_avg_sq", "step"), (*moments, step)))
        held = optimizer.state[eager]
        assert torch.equal(param, eager.detach()) and torch.equal(state["exp_avg_sq"], held["exp_avg_sq"])
        assert torch.equal(state["exp_avg"], held["exp_avg"]) and torch.equal(state["step"], held["step"])


def test_the_float64_reference_runs_the_training_program_as_eager_float64_does():
    program = training(ATTENTION)
    reference = open_reference("torch:cpu:float64", program, 1 << 28)
    for step, (loss, _, params) in enumerate(eager_steps(ATTENTION, dtype=torch.float64)):
        torch.testing.assert_close(reference.value(program.losses[step]), loss, rtol=1e-12, atol=1e-14)
        for name, param in params.items():
            torch.testing.assert_close(reference.value(updated(name, step)), param, rtol=1e-12, atol=1e-14)
    assert reference.value("step_p_q_weight_updated_step2").item() == STEPS  # AdamW's step count


def test_the_gpt_example_trains_as_eager_torch_does():
    path = EXAMPLES / "train_gpt.py"
    session = launched(path, steps=2)
    assert session.run().reason == "end"
    program = session.program
    assert program.step_starts == [0, len(program) // 2]
    for step, (loss, _, params) in enumerate(eager_steps(path, steps=2)):
        torch.testing.assert_close(session.tensor(program.losses[step]), loss, rtol=1e-6, atol=1e-8)
    for name, param in params.items():
        torch.testing.assert_close(session.tensor(value(name)), param, rtol=1e-6, atol=1e-8)


# -- the user's language -----------------------------------------------------------------------------------------

def test_backward_nodes_name_their_forward_node_and_its_line():
    program = training(MLP)
    first = program.nodes[: program.step_starts[1]]
    backward = [n for n in first if n.phase == "backward"]
    # torch's sequence numbers reach every traced backward op: each names the forward node it differentiates
    assert backward and all(n.differentiates is not None for n in backward)
    relu = next(n for n in first if n.op == "aten.relu.default")
    grad_relu = next(n for n in backward if n.differentiates == relu.index)
    assert grad_relu.name == "relu_backward" and grad_relu.op == "aten.threshold_backward.default"
    assert (grad_relu.loc, grad_relu.frames, grad_relu.module_stack) == (relu.loc, relu.frames, relu.module_stack)
    assert relu.loc.line == line_of(MLP, "hidden = torch.relu(self.l1(x))")
    l2 = [n for n in backward if program.nodes[n.differentiates].module_path == "l2"]
    assert l2 and all(n.loc.line == line_of(MLP, "return self.l2(hidden)") and "_backward" in n.name for n in l2)
    loss = next(n for n in first if n.phase == "forward" and n.op == "aten.nll_loss_forward.default")
    assert loss.loc.line == line_of(MLP, "return nn.functional.cross_entropy")  # the loss function's own line
    assert [n.phase for n in first] == sorted((n.phase for n in first), key=["forward", "backward",
                                                                            "optimizer"].index)
    repeated = program.nodes[program.step_starts[2] + grad_relu.index]
    assert (repeated.name, repeated.step) == ("relu_backward_step2", 2)
    assert program.nodes[repeated.differentiates].name == "relu_step2"


def test_a_backward_frame_says_whose_gradient_it_computes():
    session, program = launched(MLP), training(MLP)
    grad_relu = next(n for n in program.nodes if n.name == "relu_backward")
    session.goto(grad_relu.index)
    top = session.frames()[0]
    assert top.name.startswith("grad of relu: relu_backward (aten.threshold_backward)")
    assert (top.file, top.line) == (str(MLP), line_of(MLP, "hidden = torch.relu"))
    assert session.source_names()["hidden"] == "relu"  # the forward's variables, as the forward left them
    session.close()


def test_gradients_and_optimizer_state_are_values_expressions_read():
    session, program = ran(ATTENTION), training(ATTENTION)
    grad = session.evaluate("grad_p_q_weight")
    assert torch.equal(grad, session.evaluate("$grad_p_q_weight"))
    assert grad.shape == program.values["p_q_weight"].shape
    assert {"exp_avg_p_q_weight", "exp_avg_sq_p_q_weight", "step_p_q_weight"} <= {
        n for n, v in program.values.items() if v.kind == "buffer"}
    assert session.evaluate("step_p_q_weight").item() == STEPS  # the state value holds its last update
    moment = session.evaluate("exp_avg_sq_p_q_weight_updated_step2")
    assert torch.equal(moment, session.evaluate("exp_avg_sq_p_q_weight")) and bool((moment > 0).all())


# -- every feature across the steps -------------------------------------------------------------------------------

def test_a_nan_only_the_backward_makes_stops_at_the_gradient_of_the_log_line():
    session = launched(NAN_GRADIENT, steps=1)
    session.set_exception_filters(["nan"])
    stop = session.run()
    program = session.program
    writer = program.nodes[stop.tick - 1]
    assert stop.reason == "exception" and stop.exception.filter == "nan"
    assert writer.phase == "backward" and program.nodes[writer.differentiates].op == "aten.log.default"
    assert writer.loc.line == line_of(NAN_GRADIENT, "# BUG")
    assert bool(torch.isfinite(session.tensor("loss")).all())  # the forward's loss is finite
    assert session.forensics.first_nonfinite().node is writer  # it reaches the trained parameter: it matters
    session.close()


def test_a_data_breakpoint_on_a_parameter_stops_at_each_update_and_stepping_back_restores_it_bit_for_bit():
    session, program = launched(MLP), training(MLP)
    session.set_data_breakpoints([DataSpec("p_l1_weight")])
    for step in range(STEPS):
        stop = session.run()
        writer = program.nodes[stop.tick - 1]
        assert stop.reason == "data breakpoint" and (writer.phase, writer.step) == ("optimizer", step)
        before, after = session.tensor("p_l1_weight", stop.tick - 1), session.tensor("p_l1_weight")
        assert not torch.equal(before, after)
        back = session.step(Direction.REVERSE, "instruction")
        assert back.tick == stop.tick - 1 and torch.equal(session.tensor("p_l1_weight"), before)
        assert session.run().tick == stop.tick  # forward again to the same update
    assert session.run().reason == "end"
    session.close()


@pytest.fixture(scope="module")
def mlp_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("training") / "train.rwtrace"
    ran(MLP).save_trace(str(path))
    return path


def opened(path: Path) -> Session:
    session = Session(None)
    session.launch(LaunchOptions(trace=str(path)))
    return session


def test_a_training_trace_reopens_with_its_steps_and_backward_links(mlp_trace):
    reopened = opened(mlp_trace)
    program, recorded = training(MLP), reopened.program
    assert (recorded.step_starts, recorded.losses, recorded.gradients) == (
        program.step_starts, program.losses, program.gradients)
    assert [(n.phase, n.step, n.differentiates) for n in recorded.nodes] == [
        (n.phase, n.step, n.differentiates) for n in program.nodes]
    assert torch.equal(reopened.tensor("p_l1_weight", reopened.end), ran(MLP).tensor("p_l1_weight"))
    reopened.close()


def _first_backward(program: dict) -> dict:
    return next(n for n in program["nodes"] if n["phase"] == "backward")


TRACE_CASES = {
    "a phase of its own": (lambda p: _first_backward(p).update(phase="sideways"), "malformed phase 'sideways'"),
    "a step that is text": (lambda p: p["nodes"][0].update(step="0"), "malformed phase 'forward' or step '0'"),
    "a backward node differentiating a later node": (
        lambda p: _first_backward(p).update(differentiates=len(p["nodes"]) - 1), "not a forward node before it"),
    "a forward node differentiating one": (lambda p: p["nodes"][1].update(differentiates=0),
                                           "differentiates node 0, not a forward node before it"),
    "steps that do not start at 0": (lambda p: p.update(step_starts=[5, 1]), "not node indices rising from 0"),
    "a loss that is no value": (lambda p: p["losses"].__setitem__(0, "ghost"), "name 'ghost', which is not a value"),
    "gradients of numbers": (lambda p: p["gradients"].__setitem__(0, {"p_l1_weight": 3}),
                             "is not a map of names to names"),
    "fewer losses than steps": (lambda p: p.update(losses=p["losses"][:1]), f"has {STEPS} steps, 1 losses"),
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_a_crafted_training_field_of_a_trace_is_refused_in_words(mlp_trace, tmp_path, case):
    edit, says = TRACE_CASES[case]

    def changed(program: dict) -> dict:
        edit(program)
        return program
    path = tmp_path / "crafted.rwtrace"
    path.write_bytes(build(crafted(frames_of(mlp_trace.read_bytes()), PROGRAM, changed)))
    with pytest.raises(TraceError, match=re.escape(says)) as refused:
        opened(path)
    assert_clear(str(refused.value))


def test_a_trace_recorded_before_training_steps_opens_as_an_inference_pass(tmp_path):
    live = Session(None)
    live.launch(LaunchOptions(str(EXAMPLES / "mlp.py"), driver="torch:cpu"))
    live.run()
    path = tmp_path / "old.rwtrace"
    live.save_trace(str(path))

    def older(program: dict) -> dict:
        for node in program["nodes"]:
            for key in ("phase", "step", "differentiates"):
                del node[key]
        for key in ("step_starts", "losses", "gradients"):
            del program[key]
        return program
    path.write_bytes(build(crafted(frames_of(path.read_bytes()), PROGRAM, older)))
    reopened = opened(path)
    assert {(n.phase, n.step, n.differentiates) for n in reopened.program.nodes} == {("forward", 0, None)}
    assert reopened.program.step_starts == [] and reopened.run().reason == "end"
    reopened.close()
    live.close()


def test_launch_takes_steps_over_dap_and_refuses_bad_ones():
    schema = SchemaCheck()
    debugger = Debugger.spawn(schema)
    try:
        debugger.initialize()
        launch = {"program": str(MLP), "entry": "train_step", "driver": "torch:cpu"}
        refusals = {0: "field 'steps'", "2": "field 'steps'", MAX_STEPS + 1: f"from 1 to {MAX_STEPS}"}
        for steps, words in refusals.items():
            with pytest.raises(DapError, match=words):
                debugger.request("launch", {**launch, "steps": steps})
        with pytest.raises(DapError, match="steps counts training steps"):
            debugger.request("launch", {**launch, "program": str(EXAMPLES / "mlp.py"), "entry": "build", "steps": 2})
        mark = debugger.client.mark()
        debugger.request("launch", {**launch, "steps": 2})  # the launches refused left the session unlaunched
        debugger.client.wait_for("initialized", after=mark)
        assert debugger.motion("configurationDone", {})["reason"] == "end"
        eager = eager_steps(MLP, steps=2)
        shown = {"rel": 1e-4, "abs": 1e-5}  # the answer shows 5 digits
        assert debugger.number("loss_step1") == pytest.approx(eager[1][0].item(), **shown)
        assert debugger.number("grad_p_l2_bias_step1.abs().sum()") == pytest.approx(
            eager[1][1]["l2.bias"].abs().sum().item(), **shown)
    finally:
        debugger.close()
    assert schema.failures == []


# -- hostile files and options -----------------------------------------------------------------------------------

HEADER = '''
import torch
from torch import nn


def tiny():
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def pair(rows=4):
    return torch.randn(rows, 3), torch.randn(rows, 2)
'''


def model_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "model.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def sgd(model: str = "m") -> str:
    return f"torch.optim.SGD({model}.parameters(), lr=0.1)"


@pytest.mark.parametrize("body, words", [
    ("def train_step():\n    return tiny(), pair()",
     "train_step\\(\\) in .* must return \\(module, inputs, loss_fn, optimizer\\), or \\(module, inputs, optimizer\\)"),
    (f"def train_step():\n    m = tiny()\n    return m, pair(), 'mse', {sgd()}",
     "a str where the loss function belongs"),
    (f"def train_step():\n    m = tiny()\n    return 'model', pair(), {sgd()}", "returned str where a torch.nn.Module"),
    (f"def train_step():\n    m = tiny()\n    return m, (torch.randn(4, 3),), nn.MSELoss(), {sgd()}",
     "its inputs are the module's inputs then the target"),
    (f"def train_step():\n    m = tiny()\n    return m, [1, 2], {sgd()}", "inputs of type list; a tuple belongs"),
    ("def train_step():\n    m = tiny()\n    return m, pair(), nn.MSELoss(), torch.optim.RMSprop(m.parameters())",
     "the optimizer is a torch.optim.rmsprop.RMSprop; Rewind runs torch.optim.SGD .*, torch.optim.Adam and "
     "torch.optim.AdamW"),
    ("def train_step():\n    m = tiny()\n    return m, pair(), nn.MSELoss(), torch.optim.SGD(m.parameters(), lr=0.1), "
     "'fast'", "returned a str after the optimizer, where its learning-rate scheduler, a torch.amp.GradScaler or a "
     "dict of the step's options belongs"),
    ("def train_step():\n    m = tiny()\n    return m, pair(), nn.MSELoss(), "
     "torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)", "updates a tensor that is not a parameter"),
    ("def train_step():\n    raise RuntimeError('no data mounted')", "calling train_step\\(\\) in .* failed: no data "
     "mounted \\(at model.py:\\d+\\)"),
], ids=["two-things", "loss-not-callable", "not-a-module", "no-target", "inputs-list", "rmsprop", "after-the-optimizer",
        "foreign-tensor", "raises"])
def test_a_wrong_train_step_is_refused_in_words(tmp_path, body, words):
    with pytest.raises(ProgramLoadError, match=words):
        load_program(model_file(tmp_path, body), "train_step")


TRAIN_STEP = f"def train_step():\n    m = tiny()\n    return m, pair(), nn.MSELoss(), {sgd()}\n"


@pytest.mark.parametrize("batches, steps, words", [
    ("def batches():\n    yield pair()\n    raise ValueError('the data loader lost its shard')", 2,
     "calling batches\\(\\) in .* failed: the data loader lost its shard \\(at model.py:\\d+\\)"),
    ("def batches():\n    yield pair(rows=5)", 1,
     "batch 0 of batches\\(\\) in .*: input \\[0\\] is float32\\[5, 3\\]; the step was exported for float32\\[4, 3\\]"),
    ("def batches():\n    yield pair()[0]", 1,
     "is laid out as 1 positional input; train_step\\(\\)'s inputs are 2 positional inputs"),
    ("def batches():\n    yield pair()", 3, "batches\\(\\) in .* gave 1 batch; 3 steps need 3"),
    ("def batches():\n    return 3", 1, "must yield the inputs of each step \\(a generator\\); it returned 3"),
    ("batches = 3", 1, "'batches' in .* is not callable"),
], ids=["raises", "wrong-shape", "wrong-layout", "too-few", "not-a-generator", "not-callable"])
def test_bad_batches_are_refused_in_words(tmp_path, batches, steps, words):
    with pytest.raises(ProgramLoadError, match=words):
        load_program(model_file(tmp_path, TRAIN_STEP + batches), "train_step", steps)


@pytest.mark.parametrize("steps", [0, -1, True, 2.5, "3", MAX_STEPS + 1])
def test_steps_out_of_range_or_of_the_wrong_type_are_refused(tmp_path, steps):
    with pytest.raises(ProgramLoadError, match=f"steps is the number of training steps, a whole number from 1 to "
                                               f"{MAX_STEPS}"):
        load_program(model_file(tmp_path, TRAIN_STEP), "train_step", steps)


def test_steps_that_would_make_too_large_a_program_are_refused_with_the_most_that_fit(tmp_path):
    adam = ("def train_step():\n    m = nn.Sequential(tiny(), nn.Tanh(), nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 2))\n"
            "    return m, pair(), nn.MSELoss(), torch.optim.AdamW(m.parameters())\n")
    with pytest.raises(ProgramLoadError, match=f"{MAX_STEPS} steps of \\d+ nodes each make \\d+ nodes; a Program "
                                               f"holds at most {MAX_NODES}: at most \\d+ steps of this model"):
        load_program(model_file(tmp_path, adam), "train_step", MAX_STEPS)


@pytest.mark.parametrize("body, words", [
    (f"def train_step():\n    m = tiny()\n    return m, (torch.randn(4, 3),), {sgd()}",
     "the loss must be one floating-point number \\(a 0-dim tensor\\); the training step's is float32\\[4, 2\\]"),
    ("def train_step():\n    m = tiny()\n"
     f"    return m, pair(), lambda out, t: (torch.poisson(out.exp()) * out).mean(), {sgd()}",
     "draws random numbers with poisson, which stepping back cannot replay; Rewind replays bernoulli, .*native_dropout"),
], ids=["loss-not-a-number", "random-op-with-no-seeded-twin"])
def test_a_step_rewind_cannot_replay_or_reduce_is_refused_in_words(tmp_path, body, words):
    with pytest.raises(ProgramLoadError, match=words):
        load_program(model_file(tmp_path, body), "train_step")


def test_a_target_named_as_a_node_of_the_step_keeps_its_own_value(tmp_path):
    path = model_file(tmp_path, "def train_step():\n    m = tiny()\n"
                                f"    return m, pair(), lambda out, t: ((out - t) ** 2).mean(), {sgd()}\n")
    program = load_program(path, "train_step")
    assert program.values["t"].kind == "input"  # the target, named as the loss function names it
    transpose = next(n for n in program.nodes if n.op == "aten.t.default" and n.phase == "forward")
    assert transpose.outputs != ["t"] and transpose.input_names() == ["p_weight"]
    subtract = next(n for n in program.nodes if n.op == "aten.sub.Tensor")
    assert "t" in subtract.input_names() and subtract.loc.line == line_of(path, "lambda out, t")
