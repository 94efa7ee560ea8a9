"""What a Python user expects to see at a stop, through the Session: the line that wrote a bad value, a module's
arguments and its callers' names, the names they wrote (tuples unpacked, aliases, subscripts), locals of the frame
shown, and a name that does not resolve here said so (never another value of the same name).

The models: tests/models/frames_names.py (small, every construct on a known line) and tests/models/hf_tiny.py
(transformers' LLaMA and T5, random weights built in the file)."""

import sys

import pytest
import torch

from hardware.errors import ExpressionError, RewindError
from hardware.frontends.torch_export import load_module
from hardware.session import DataSpec, Direction, FunctionSpec
from tests.conftest import MODELS, line_of, open_session, program

NAMES = MODELS / "frames_names.py"
HF = MODELS / "hf_tiny.py"


def session_at_nan():
    session = open_session(NAMES, entry="zero_row")
    session.set_exception_filters(["nan"])
    stop = session.start()
    assert stop.reason == "exception" and stop.exception.node == "mul_1"
    return session


# -- 3: the guilty line ---------------------------------------------------------------------------------------------
def test_a_nan_stop_shows_the_node_that_wrote_it_at_its_line_with_its_callers():
    session = session_at_nan()
    frames = session.frames()
    assert [(f.name, f.line) for f in frames] == [
        ("mul_1 (after write) (aten.mul) [block.norm]", line_of(NAMES, "return x * torch.rsqrt")),
        ("Block.forward [block]", line_of(NAMES, "h = self.norm(h * 2)")),
        ("Model.forward [<root>]", line_of(NAMES, "outputs = self.block(x)"))]
    assert session.frame_node().name == "mul_1"
    assert list(session.source_names()) == ["x", "scale"]  # the norm's names, the write's result is no variable
    assert session.exception_info().node == "mul_1"  # the evidence stays
    assert torch.isnan(session.evaluate("mul_1")[1]).all()


def test_from_the_writer_a_step_forward_shows_the_next_node_and_a_step_back_the_instant_before_the_write():
    session = session_at_nan()
    q = session.position
    stop = session.step(Direction.FORWARD)
    assert stop.reason == "step" and session.position == q  # the next node is about to run: nothing ran
    top = session.frames()[0]
    assert top.name == "linear (aten.linear) [block.attn]" and top.line == line_of(NAMES, "weights = torch.softmax")
    session.restart()
    assert session.last_stop.reason == "exception" and session.position == q
    stop = session.step(Direction.REVERSE)
    assert stop.reason == "step" and session.position == q - 1  # the instant before the write
    top = session.frames()[0]
    assert top.name == "mul_1 (aten.mul) [block.norm]" and top.line == line_of(NAMES, "return x * torch.rsqrt")
    with pytest.raises(RewindError, match="not written yet"):
        session.evaluate("mul_1")
    session.restart()
    stop = session.step(Direction.FORWARD, kind="out")  # out of the norm: its writer was its last node
    assert stop.reason == "step" and session.position == q
    assert [f.line for f in session.frames()][1] == line_of(NAMES, "attn_output, _ = self.attn(h)")


def test_a_data_breakpoint_stop_shows_the_writer_and_its_names():
    session = open_session(NAMES)
    session.set_data_breakpoints([DataSpec("mean")])
    stop = session.start()
    assert stop.reason == "data breakpoint"
    top = session.frames()[0]
    assert top.name == "mean (after write) (aten.mean) [block.norm]"
    assert top.line == line_of(NAMES, "scale = x.pow(2)")
    assert session.source_names() == {"x": "mul", "scale": "mean"}
    assert torch.equal(session.evaluate("scale"), session.tensor("mean"))
    session.goto(session.position)  # any other stop shows the node about to run again
    assert session.frames()[0].name.startswith("add (aten.add)")


# -- 4: module inputs and callers -------------------------------------------------------------------------------------
def test_a_module_breakpoint_shows_the_forward_arguments_and_each_caller_its_own_names():
    session = open_session(HF, entry="llama")
    session.set_function_breakpoints([FunctionSpec("model.norm")])
    assert session.start().reason == "function breakpoint"
    frames = session.frames()
    source = program(str(HF), "llama").source_files[frames[0].file].splitlines()
    assert source[frames[0].line - 1].strip().startswith("variance = hidden_states.pow(2)")
    assert [f.name.split(" [")[0] for f in frames[1:]] == ["LlamaModel.forward", "LlamaForCausalLM.forward"]
    # the norm's argument: the last decoder layer's output, as the caller's `hidden_states` holds it
    value = session.resolve_name("hidden_states")
    assert session.frame_arguments() == {"hidden_states": value}
    assert session.source_names(level=1)["hidden_states"] == value
    assert torch.equal(session.evaluate("hidden_states"), session.evaluate("hidden_states", level=1))
    assert session.provenance(value)["lastWriter"]["node"] == value
    assert session.locate(value).shards[0].nbytes == 8 * 32 * 4
    # the caller's names are the caller's
    assert {"inputs_embeds", "position_ids", "causal_mask"} <= set(session.source_names(level=1))
    assert session.evaluate("inputs_embeds", level=1).shape == (1, 8, 32)
    with pytest.raises(ExpressionError, match=r"name 'inputs_embeds' is not defined at this tick in "
                                              r"LlamaRMSNorm.forward \[model.norm\]: it is a variable of "
                                              r"LlamaModel.forward \[model\] \(frame 1, a caller\)"):
        session.evaluate("inputs_embeds")
    assert session.source_names(level=2) == {"input_ids": "input_ids"}  # the outermost: the program's input


# -- 5: names a user wrote --------------------------------------------------------------------------------------------
def eager_locals(path, entry):
    """Eager Python's locals of every frame of a module's forward, at each line it begins: (module path, function,
    line) -> [name -> value], one entry per time the line began (copies, so later in-place writes do not show)."""
    files = set(program(str(path), entry).files())
    model, inputs = load_module(path, entry)
    paths = {id(m): name for name, m in model.named_modules()}
    seen: dict[tuple, list[dict]] = {}

    def tracer(frame, event, arg):
        if frame.f_code.co_filename not in files:
            return None

        def line(frame, event, arg):
            module = paths.get(id(frame.f_locals.get("self")))
            if event == "line" and module is not None:
                seen.setdefault((module, frame.f_code.co_name, frame.f_lineno), []).append(
                    {k: (v.detach().clone(), id(v)) if isinstance(v, torch.Tensor) else (v, id(v))
                     for k, v in frame.f_locals.items()})
            return line
        return line

    sys.settrace(tracer)
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        sys.settrace(None)
    return seen


@pytest.mark.parametrize("path, entry, wanted", [
    (NAMES, "build", {("block", "residual"), ("block", "attn_output"), ("block", "_"), ("", "hidden"),
                      ("block.norm", "x"), ("block.attn", "hidden"), ("block", "h"), ("", "x")}),
    (HF, "llama", {("model.layers.0", "residual"), ("model.layers.1", "hidden_states"),
                   ("model.layers.0.self_attn", "cos"), ("model.layers.0.self_attn", "attn_output"),
                   ("model.layers.0.input_layernorm", "hidden_states"), ("model.norm", "hidden_states"),
                   ("model.layers.0.mlp", "x"), ("model", "hidden_states"), ("model", "inputs_embeds"),
                   ("", "hidden_states")}),
])
def test_every_name_the_engine_gives_is_the_value_eager_python_holds_in_that_frame(path, entry, wanted):
    """At every tick and every frame of the stack, each source variable the engine names (tuples unpacked from a
    module's return, aliases, subscripts, a module's arguments) is bit for bit the tensor eager Python holds under
    that name in that frame as the line begins; and the names that need each construct are among them."""
    eager = eager_locals(path, entry)
    session = open_session(path, entry=entry)
    session.goto(session.end)
    compared, covered = 0, set()
    for tick in range(session.end):
        node = session.tl.node_at(tick)
        for level, frame in enumerate(reversed(node.frames)):
            snapshots = eager.get((frame.module_path, frame.loc.function, frame.loc.line), [])
            if not snapshots or any({k: i for k, (_, i) in s.items()} != {k: i for k, (_, i) in snapshots[0].items()}
                                    for s in snapshots):
                continue  # a line run more than once with other values (a loop): not one answer
            held = snapshots[0]
            for name, value in session.source_names(tick, level).items():
                assert name in held, f"tick {tick}: '{name}' is named in {frame.module_path} before Python has it"
                ours = session.tl.value(value, tick)
                assert isinstance(held[name][0], torch.Tensor) and torch.equal(held[name][0], ours), \
                    f"tick {tick}, {frame.module_path}: '{name}' is {value}, not what Python holds"
                compared += 1
                covered.add((frame.module_path, name))
    session.close()
    assert wanted <= covered, f"never named: {wanted - covered}"
    assert compared > 2 * len(wanted)


def test_tuples_are_unpacked_and_a_tuple_is_not_one_tensor():
    session = open_session(NAMES)
    session.goto(session.end)
    names = session.source_names()
    assert names["hidden"] == "add_1"  # hidden = outputs[0]: Block returned (h, attn_output)
    assert torch.equal(session.evaluate("outputs[0]"), session.evaluate("hidden"))
    with pytest.raises(RewindError, match=r"'outputs' is not one tensor: it holds 2 values \(add_1, linear_1\)"):
        session.resolve_name("outputs")


# -- 6: end of program -------------------------------------------------------------------------------------------------
def test_at_the_end_the_locals_are_the_frame_shown():
    session = open_session(NAMES, entry="wrapped")
    session.goto(session.end)
    frames = session.frames()
    assert [f.name for f in frames] == ["linear_2 (aten.linear) [model]", "Wrapper.forward [<root>]"]
    assert set(session.source_names()) == {"x", "hidden"}  # `outputs` is a tuple: no one tensor
    x = session.evaluate("x")  # Model.forward's x: the wrapper's x * 2, not the program's input x
    assert torch.equal(x, session.tensor("x") * 2)
    assert torch.equal(session.evaluate("x", level=1), session.tensor("x"))


def test_at_the_end_of_a_t5_in_a_wrapper_the_logits_line_has_its_locals():
    session = open_session(HF, entry="t5_wrapped")
    session.goto(session.end)
    top = session.frames()[0]
    source = program(str(HF), "t5_wrapped").source_files[top.file].splitlines()
    assert source[top.line - 1].strip() == "lm_logits = self.lm_head(sequence_output)"
    names = session.source_names()
    assert {"lm_logits", "sequence_output", "hidden_states", "input_ids", "decoder_input_ids"} <= set(names)
    assert torch.equal(session.evaluate("lm_logits"), session.tensor(session.program.outputs[0]))
    assert set(session.source_names(level=1)) == {"input_ids", "decoder_input_ids"}


# -- a name that does not resolve here says so ------------------------------------------------------------------------
def test_a_variable_of_another_frame_or_not_assigned_yet_is_not_defined_here():
    session = open_session(NAMES)
    session.set_function_breakpoints([FunctionSpec("block.attn")])
    assert session.start().reason == "function breakpoint"
    assert [f.name.split(" (")[0] for f in session.frames()] == ["linear", "Block.forward [block]",
                                                                "Model.forward [<root>]"]
    with pytest.raises(ExpressionError, match=r"^name 'x' is not defined at this tick in Attention.forward "
                                              r"\[block.attn\]: it is a variable of Model.forward \[<root>\] "
                                              r"\(frame 2, a caller\)$"):
        session.evaluate("x")  # the program's input is named x too: it is not this frame's
    with pytest.raises(RewindError, match="not defined at this tick in Attention.forward"):
        session.resolve_name("x")
    assert torch.equal(session.evaluate("x", level=2), session.tensor("x"))
    with pytest.raises(ExpressionError, match=r"^name 'weights' is not defined at this tick in Attention.forward "
                                              rf"\[block.attn\]: line {line_of(NAMES, 'weights = torch')} assigns "
                                              "it and has not run yet$"):
        session.evaluate("weights")
    assert session.source_names(level=1) == {"h": "mul_1", "residual": "x"}  # Block: its own h, the norm's result
    assert session.frame_arguments(level=1) == {"h": "x"}  # as Block was called
    assert torch.equal(session.evaluate("pow_1"), session.tensor("pow_1"))  # a Program value is reachable by name
    with pytest.raises(ExpressionError, match="^name 'nothing' is not defined at this tick$"):
        session.evaluate("nothing")
