"""Stepping by source line as gdb does, through the Session: over calls in both directions (a stop on a call line
shows the caller, at the instant before the call's first node runs), back from inside a line to where it began,
`statement` and `line` as one granularity with `instruction` one node, and node stepping by step-in targets on every
driver (on the sim chip, where `instruction` is one chip instruction)."""

from pathlib import Path

import pytest
import transformers.models.llama.modeling_llama as modeling_llama

from hardware.errors import RewindError
from hardware.session import DataSpec, Direction
from tests.conftest import EXAMPLES, MODELS, line_of, open_session

GPT = EXAMPLES / "gpt.py"
LLAMA = MODELS / "tiny_llama.py"
LLAMA_SOURCE = Path(modeling_llama.__file__)
BACK, FORWARD = Direction.REVERSE, Direction.FORWARD

CALL_BLOCK = line_of(GPT, "x = block(x)")  # GPT.forward's loop: one call per block
CALL_ATTN = line_of(GPT, "x = x + self.attn(self.ln1(x))")  # Block.forward's first line
CALL_MLP = line_of(GPT, "x = x + self.mlp(self.ln2(x))")
HEAD = line_of(GPT, "logits = self.head")
QKV = line_of(GPT, "self.qkv(x).split")
SCORES = line_of(GPT, "scores = q @ k")
MASK = line_of(GPT, "mask = torch.ones")

AFTER_ATTN = line_of(LLAMA_SOURCE, "hidden_states = residual + hidden_states")  # the line after self_attn's call
SELF_ATTN = line_of(LLAMA_SOURCE, "hidden_states, _ = self.self_attn(")
POST_NORM = line_of(LLAMA_SOURCE, "hidden_states = self.post_attention_layernorm(hidden_states)")
MLP = line_of(LLAMA_SOURCE, "hidden_states = self.mlp(hidden_states)")
INPUT_NORM = line_of(LLAMA_SOURCE, "hidden_states = self.input_layernorm(hidden_states)")
LAYER = line_of(LLAMA_SOURCE, "hidden_states = decoder_layer(")
AFTER_MLP = next(i for i, text in enumerate(LLAMA_SOURCE.read_text().splitlines(), 1)
                 if i > MLP and "hidden_states = residual + hidden_states" in text)


@pytest.fixture(scope="module")
def gpt():
    return open_session(GPT)


@pytest.fixture(scope="module")
def llama():
    return open_session(LLAMA)


def top(session) -> tuple[str, int, int]:
    """The top frame's file name and line, and how many frames the stack shows."""
    frames = session.frames()
    return Path(frames[0].file).name, frames[0].line, len(frames)


def begins(session, path: Path, line: int) -> list[int]:
    """The ticks where each execution of a line begins (as breakpoints and goto targets count them)."""
    _, ticks = session.line_positions(str(path), line)
    assert ticks, f"line {line} of {path.name} runs no node"
    return ticks


def test_back_from_the_line_after_a_loop_of_calls_lands_on_the_last_call_in_the_caller(gpt):
    blocks = begins(gpt, GPT, CALL_BLOCK)  # blocks.0's call, then blocks.1's
    gpt.goto(begins(gpt, GPT, HEAD)[0])
    stop = gpt.step(BACK)
    assert (stop.reason, stop.tick) == ("step", blocks[1])  # the instant before blocks.1's first node
    assert top(gpt) == ("gpt.py", CALL_BLOCK, 1)  # in GPT.forward, not inside Block.forward
    assert gpt.frames()[0].module_path == ""


def test_back_from_a_functions_first_line_lands_on_its_call_line_without_moving(gpt):
    blocks = begins(gpt, GPT, CALL_BLOCK)
    gpt.goto(begins(gpt, GPT, CALL_ATTN)[1])  # blocks.1's first line
    assert top(gpt) == ("gpt.py", CALL_ATTN, 2)
    assert gpt.step(BACK).tick == blocks[1] and top(gpt) == ("gpt.py", CALL_BLOCK, 1)  # the same instant
    assert gpt.step(BACK).tick == blocks[0] and top(gpt) == ("gpt.py", CALL_BLOCK, 1)  # blocks.0's call
    assert gpt.step(kind="in").tick == blocks[0] and top(gpt) == ("gpt.py", CALL_ATTN, 2)  # into it, in place


def test_back_from_the_line_after_a_call_lands_where_the_call_line_began(gpt):
    attn = begins(gpt, GPT, CALL_ATTN)
    gpt.goto(begins(gpt, GPT, CALL_MLP)[1])  # blocks.1, after `x = x + self.attn(self.ln1(x))`
    assert gpt.step(BACK).tick == attn[1] and top(gpt) == ("gpt.py", CALL_ATTN, 2)  # at ln1, the line's first node
    assert gpt.step(BACK).tick == attn[1] and top(gpt) == ("gpt.py", CALL_BLOCK, 1)


def test_back_from_inside_a_line_goes_to_where_it_began_and_reverse_finish_to_the_call_line(gpt):
    attn = begins(gpt, GPT, CALL_ATTN)
    gpt.goto(begins(gpt, GPT, SCORES)[0])
    entered = gpt.step(BACK, kind="out")  # gdb's reverse-finish: where attention was called, in Block.forward
    assert entered.tick == begins(gpt, GPT, QKV)[0] and top(gpt) == ("gpt.py", CALL_ATTN, 2)
    gpt.goto(begins(gpt, GPT, SCORES)[0])
    returned = gpt.step(kind="out")  # attention has returned: the rest of the call line (the residual add) is next
    assert top(gpt) == ("gpt.py", CALL_ATTN, 2) and gpt.tl.node_at(returned.tick).name == "add_1"
    assert gpt.step(BACK).tick == attn[0] and top(gpt) == ("gpt.py", CALL_ATTN, 2)  # where that line began


def test_back_over_a_call_whose_line_has_no_node_of_its_own_lands_on_the_call_line(llama):
    call = begins(llama, LLAMA_SOURCE, SELF_ATTN)[0]  # the first node of layer 0's attention
    llama.goto(begins(llama, LLAMA_SOURCE, AFTER_ATTN)[0])
    assert top(llama) == ("modeling_llama.py", AFTER_ATTN, 3)
    stop = llama.step(BACK)
    assert stop.tick == call
    assert top(llama) == ("modeling_llama.py", SELF_ATTN, 3)  # LlamaDecoderLayer.forward, not LlamaAttention's
    assert llama.frames()[0].module_path == "model.layers.0"
    assert llama.step().tick > call and top(llama) == ("modeling_llama.py", AFTER_ATTN, 3)  # and over it again


def test_next_steps_over_calls_and_stops_on_call_lines_in_the_caller(llama):
    llama.goto(begins(llama, LLAMA_SOURCE, AFTER_ATTN)[0])
    lines = []
    for _ in range(4):
        llama.step()
        lines.append(top(llama)[1:])
    assert lines == [(POST_NORM, 3), (MLP, 3), (AFTER_MLP, 3), (LAYER, 2)]
    assert llama.frames()[0].module_path == "model"  # layer 1's call, in LlamaModel.forward's loop
    layer = llama.position
    assert layer == begins(llama, LLAMA_SOURCE, INPUT_NORM)[1]
    assert llama.step(kind="in").tick == layer and top(llama)[1:] == (INPUT_NORM, 3)
    assert llama.frames()[0].module_path == "model.layers.1"
    assert llama.step(kind="in").tick == layer and top(llama)[2] == 4  # into the norm's first line
    assert llama.frames()[0].module_path == "model.layers.1.input_layernorm"


def test_statement_line_and_no_granularity_are_one_and_instruction_is_one_node(gpt):
    scores = begins(gpt, GPT, SCORES)[0]
    landings = []
    for granularity in ("statement", "line", None):
        gpt.goto(scores)
        stop = gpt.step(FORWARD, granularity) if granularity else gpt.step(FORWARD)
        landings.append((stop.tick, top(gpt)))
    assert landings == [(begins(gpt, GPT, MASK)[0], ("gpt.py", MASK, 3))] * 3
    gpt.goto(scores)
    assert gpt.step(FORWARD, "instruction").tick == scores + 1
    assert gpt.step(BACK, "instruction").tick == scores


def test_an_unknown_granularity_is_refused_in_words(gpt):
    with pytest.raises(RewindError, match=r"unknown stepping granularity 'node': statement \(a line of source"):
        gpt.step(FORWARD, "node")


def test_step_in_targets_are_the_nodes_still_to_run_on_a_line_and_step_into_runs_to_one(gpt):
    scores = begins(gpt, GPT, SCORES)[0]
    gpt.goto(scores)
    targets = gpt.step_in_targets()
    assert [gpt.tl.node_at(t).name for t in targets] == ["matmul", "div"] and targets == [scores + 1, scores + 2]
    outer = gpt.step_in_targets(1)  # Block.forward's line: the rest of attention, then the residual add
    assert outer[:2] == targets and gpt.tl.node_at(outer[-1]).name == "add_1"
    assert gpt.step_into(scores + 2).tick == scores + 2 and top(gpt)[1] == SCORES
    with pytest.raises(RewindError, match=f"tick {scores + 1} is not a node still to run on the line"):
        gpt.step_into(scores + 1)  # behind the position now
    with pytest.raises(RewindError, match="is not a node still to run"):
        gpt.step_into(begins(gpt, GPT, CALL_BLOCK)[1])  # blocks.1's call is another execution of GPT.forward's line


def test_after_a_write_the_step_in_targets_run_the_writers_line_on_from_the_node_about_to_run(gpt):
    scores = begins(gpt, GPT, SCORES)[0]  # transpose, matmul, div
    gpt.goto(0)
    gpt.set_data_breakpoints([DataSpec("matmul")])
    try:
        stop = gpt.run()
    finally:
        gpt.set_data_breakpoints([])
    assert stop.reason == "data breakpoint" and gpt.position == scores + 2
    assert gpt.frames()[0].name.startswith("matmul") and top(gpt)[1] == SCORES  # the writer, which has run
    assert gpt.step_in_targets() == [scores + 2]  # div runs the line on
    assert gpt.step_into(scores + 2).tick == scores + 2 and gpt.frames()[0].name.startswith("div (")  # in place


def test_on_the_sim_chip_instruction_is_one_chip_instruction_and_step_into_one_node():
    session = open_session(GPT, driver="sim")
    scores = begins(session, GPT, SCORES)[0]
    session.goto(scores + 1)
    session.step(FORWARD, "instruction")
    assert (session.position, session.instruction) == (scores + 1, 1)  # inside matmul
    assert session.step_in_targets() == [scores + 2]
    assert session.step_into(scores + 2).tick == scores + 2 and session.instruction == 0  # one node on
    session.step(FORWARD, "instruction")
    assert session.step(BACK).tick == scores and session.instruction == 0  # from inside a line: where it began
