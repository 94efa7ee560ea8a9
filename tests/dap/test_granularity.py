"""Stepping through the wire: granularity as DAP defines it (omitted is `statement`, a line of source, like `line`;
`instruction` one node on the torch driver, one chip instruction on the sim chip), stepBack over calls to the call
line in the caller (examples/gpt.py and a Hugging Face Llama), and node stepping by stepInTargets and stepIn's
targetId, on the sim chip and in the console."""

import json
from pathlib import Path

import pytest
import transformers.models.llama.modeling_llama as modeling_llama

from dap_server.client import DapError
from tests.dap.wire import GPT, MODELS, Debugger, line_of, rewind

LLAMA = MODELS / "tiny_llama.py"
LLAMA_SOURCE = Path(modeling_llama.__file__)
LLAMA_LINES = LLAMA_SOURCE.read_text().splitlines()
AFTER_ATTN = line_of("hidden_states = residual + hidden_states", LLAMA_LINES)  # the line after self_attn's call
SELF_ATTN = line_of("hidden_states, _ = self.self_attn(", LLAMA_LINES)
SCORES = line_of("scores = q @ k")
MASK = line_of("mask = torch.ones")
CALL_BLOCK = line_of("x = block(x)")
HEAD = line_of("logits = self.head")


@pytest.fixture(scope="module")
def llama(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(LLAMA, stopOnEntry=True)["reason"] == "entry"
    yield debugger
    debugger.close()


@pytest.fixture(scope="module")
def chip(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(GPT, driver="sim", stopOnEntry=True)["reason"] == "entry"
    yield debugger
    debugger.close()


def targets(debugger: Debugger, path: Path, line: int) -> list[int]:
    """The ticks where each execution of a line begins (gotoTargets' ids are tick + 1)."""
    answer = debugger.request("gotoTargets", {"source": {"path": str(path)}, "line": line})
    return [t["id"] - 1 for t in answer["targets"]]


def goto(debugger: Debugger, tick: int) -> None:
    assert debugger.motion("goto", {"threadId": 1, "targetId": tick + 1})["reason"] == "goto"


def stack(debugger: Debugger) -> list[dict]:
    return debugger.request("stackTrace", {"threadId": 1})["stackFrames"]


def test_omitted_statement_and_line_granularity_step_alike_and_instruction_one_node(fresh):
    scores = targets(fresh, GPT, SCORES)[0]
    landings = []
    # singleThread too: the torch chip has one thread, so a step of it alone is the same step
    for granularity in ({}, {"granularity": "statement"}, {"granularity": "line"}, {"singleThread": True}):
        goto(fresh, scores)
        assert fresh.motion("next", {"threadId": 1, **granularity})["reason"] == "step"
        landings.append((fresh.position(), fresh.top()["line"]))
    assert landings == [(targets(fresh, GPT, MASK)[0], MASK)] * 4
    goto(fresh, scores)
    fresh.motion("next", {"threadId": 1, "granularity": "instruction"})
    assert fresh.position() == scores + 1 and fresh.top()["line"] == SCORES
    fresh.motion("stepBack", {"threadId": 1, "granularity": "instruction"})
    assert fresh.position() == scores


def test_step_back_over_a_loop_of_calls_lands_on_the_last_call_line_in_the_caller(fresh):
    fresh.set_breakpoints(GPT, [{"line": HEAD}])
    assert fresh.motion("continue")["reason"] == "breakpoint"
    fresh.set_breakpoints(GPT, [])
    assert fresh.motion("stepBack")["reason"] == "step"
    assert fresh.position() == targets(fresh, GPT, CALL_BLOCK)[1]  # blocks.1's call, before its first node
    frames = stack(fresh)
    assert len(frames) == 1 and frames[0]["line"] == CALL_BLOCK and frames[0]["source"]["path"] == str(GPT)
    fresh.motion("stepIn")  # the same instant, inside the call: blocks.1's first line
    frames = stack(fresh)
    assert len(frames) == 2 and frames[0]["line"] == line_of("x = x + self.attn(self.ln1(x))")
    assert "blocks.1" in frames[0]["name"] and fresh.position() == targets(fresh, GPT, CALL_BLOCK)[1]


def test_step_back_over_a_hugging_face_call_lands_on_the_call_line_in_the_decoder_layer(llama):
    llama.reset(LLAMA)
    llama.set_breakpoints(LLAMA_SOURCE, [{"line": AFTER_ATTN}])
    assert llama.motion("continue")["reason"] == "breakpoint"
    llama.set_breakpoints(LLAMA_SOURCE, [])
    depth = len(stack(llama))
    assert llama.motion("stepBack")["reason"] == "step"
    frames = stack(llama)
    assert Path(frames[0]["source"]["path"]).name == "modeling_llama.py"
    assert frames[0]["line"] == SELF_ATTN and len(frames) == depth  # the decoder layer, not LlamaAttention
    assert llama.position() == targets(llama, LLAMA_SOURCE, SELF_ATTN)[0]  # the instant before attention's first node
    assert "self.self_attn(" in llama.request("source", {"source": {"path": frames[0]["source"]["path"]}})[
        "content"].splitlines()[frames[0]["line"] - 1]
    llama.motion("next")  # over the call again
    assert llama.top()["line"] == AFTER_ATTN and len(stack(llama)) == depth


def test_step_in_targets_list_the_lines_nodes_and_step_in_runs_to_one(fresh):
    initialized = next(m for m in fresh.messages if m.get("command") == "initialize" and m.get("type") == "response")
    assert initialized["body"]["supportsStepInTargetsRequest"] is True
    scores = targets(fresh, GPT, SCORES)[0]
    goto(fresh, scores)
    listed = fresh.request("stepInTargets", {"frameId": 1})["targets"]
    assert [t["label"] for t in listed] == [f"tick {scores + 1}: matmul (aten.matmul.default) in blocks.0.attn",
                                            f"tick {scores + 2}: div (aten.div.Tensor) in blocks.0.attn"]
    assert {t["line"] for t in listed} == {SCORES}
    outer = fresh.request("stepInTargets", {"frameId": 2})["targets"]  # Block.forward's line runs on past attention
    assert outer[:2] == [dict(t, line=outer[0]["line"]) for t in listed] and len(outer) > len(listed)
    assert fresh.motion("stepIn", {"threadId": 1, "targetId": listed[1]["id"]})["reason"] == "step"
    assert fresh.position() == scores + 2 and fresh.top()["line"] == SCORES
    with pytest.raises(DapError, match=f"stepIn: target {listed[0]['id']} is not a node still to run"):
        fresh.request("stepIn", {"threadId": 1, "targetId": listed[0]["id"]})  # behind us now
    assert fresh.position() == scores + 2


def test_on_the_sim_chip_instruction_is_one_chip_instruction_and_step_in_targets_one_node(chip):
    scores = targets(chip, GPT, SCORES)[0]
    goto(chip, scores)
    chip.motion("next", {"threadId": 1, "granularity": "instruction"})
    assert chip.position() == scores and chip.request("units", {})["instruction"] == 1  # inside the node
    (first, second) = chip.request("stepInTargets", {"frameId": 1})["targets"]
    assert chip.motion("stepIn", {"threadId": 1, "targetId": first["id"]})["reason"] == "step"
    assert chip.position() == scores + 1 and chip.request("units", {})["instruction"] == 0  # one node on
    chip.motion("stepIn", {"threadId": 1, "targetId": second["id"]})
    assert chip.position() == scores + 2 and chip.top()["line"] == SCORES


def test_the_console_steps_node_by_node_and_instruction_by_instruction_on_the_sim_chip():
    script = (f"goto gpt.py:{SCORES}\nnext node\nnext node\nback node\nnext instruction\nback node\nback\n"
              "next\nback instruction\nquit\n")
    run = rewind("debug", str(GPT), "--driver", "sim", "--json", stdin=script)
    records = [json.loads(line) for line in run.stdout.splitlines()]
    assert run.returncode == 0, run.stdout + run.stderr
    ticks = [r["result"]["tick"] for r in records[1:]]
    scores = ticks[0]
    # one node on, another, one back; one chip instruction into the node, back to its start; back to where the
    # line began; the next line; one chip instruction back: into the line's last node, at its last step
    assert ticks == [scores, scores + 1, scores + 2, scores + 1, scores + 1, scores + 1, scores, scores + 3, scores + 2]
    lines = [r["result"]["frame"]["line"] for r in records[1:]]
    assert lines == [SCORES] * 7 + [MASK, SCORES]
