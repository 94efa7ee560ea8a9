"""Moving through time through the wire: reverse-continue, step back, goto, stepping in and out, the end."""

import base64

from tests.dap.wire import GPT, line_of
from tests.test_reverse_execution import eager_values

MASK = line_of("mask = torch.ones")
MASKED = line_of("scores = scores.masked_fill")
BLOCK_ATTN = line_of("x = x + self.attn(self.ln1(x))")


def test_reverse_continue_lands_on_last_hit(fresh):
    fresh.set_breakpoints(GPT, [{"line": MASK}])
    forward = []
    while fresh.motion("continue")["reason"] == "breakpoint":
        forward.append(fresh.position())
    assert forward == [15, 43]
    backward = []
    while (stop := fresh.motion("reverseContinue"))["reason"] == "breakpoint":
        backward.append(fresh.position())
        assert fresh.top()["line"] == MASK
    assert backward == [43, 15]
    assert stop["reason"] == "entry" and fresh.position() == 0


def scores_bytes(debugger) -> tuple[str, bytes]:
    """The value `scores` names at the stop, and every byte of it, read through readMemory."""
    placement = debugger.request("locate", {"name": "scores"})
    (shard,) = placement["shards"]
    variable = next(v for v in debugger.scope("Locals") if v["name"] == "scores")
    memory = debugger.request("readMemory", {"memoryReference": variable["memoryReference"], "offset": 0,
                                             "count": shard["nbytes"]})
    assert memory.get("unreadableBytes", 0) == 0
    return placement["value"], base64.b64decode(memory["data"])


def test_step_back_restores_values(fresh):
    """Stepping back restores `scores` as the engine wrote it before, and each of its values on the way (before the
    mask, masked, and back) is bit for bit what plain eager torch computes for the same model, weights and tokens
    (examples/gpt.py's `build()`, run eagerly: tests/test_reverse_execution.py's `eager_values`)."""
    eager = eager_values(GPT)
    fresh.set_breakpoints(GPT, [{"line": MASKED}])
    fresh.motion("continue")
    before_sum = fresh.number("scores.sum()")
    before_text = next(v for v in fresh.scope("Locals") if v["name"] == "scores")["value"]
    before_name, before_bytes = scores_bytes(fresh)
    assert before_name == "div"  # q @ k^T / sqrt(d), not yet masked
    assert before_bytes == eager[before_name][0].contiguous().numpy().tobytes()
    assert fresh.motion("next")["reason"] == "step"
    assert fresh.number("scores.sum()") == float("-inf")  # the mask wrote -inf above the diagonal
    masked_name, masked_bytes = scores_bytes(fresh)
    assert masked_name == "masked_fill" and masked_bytes != before_bytes
    assert masked_bytes == eager[masked_name][0].contiguous().numpy().tobytes()
    assert fresh.motion("stepBack")["reason"] == "step"
    assert fresh.top()["line"] == MASKED
    assert fresh.number("scores.sum()") == before_sum
    assert next(v for v in fresh.scope("Locals") if v["name"] == "scores")["value"] == before_text
    assert scores_bytes(fresh) == (before_name, before_bytes)


def test_goto_jumps_to_each_tick_a_line_ran(fresh):
    targets = fresh.request("gotoTargets", {"source": {"path": str(GPT)}, "line": MASK})["targets"]
    assert [t["label"] for t in targets] == ["tick 15: ones (aten.ones.default) in blocks.0.attn",
                                             "tick 43: ones_1 (aten.ones.default) in blocks.1.attn"]
    mark = fresh.client.mark()
    assert fresh.motion("goto", {"threadId": 1, "targetId": targets[1]["id"]})["reason"] == "goto"
    assert fresh.position() == 43 and "blocks.1.attn" in fresh.top()["name"]
    assert ("invalidated", {"areas": ["variables", "stacks"]}) in fresh.client.events_since(mark)
    fresh.motion("goto", {"threadId": 1, "targetId": targets[0]["id"]})
    assert fresh.position() == 15


def test_step_in_and_out_move_between_frames(fresh):
    fresh.set_breakpoints(GPT, [{"line": BLOCK_ATTN}])
    fresh.motion("continue")
    depth = len(fresh.request("stackTrace", {"threadId": 1})["stackFrames"])
    fresh.motion("stepIn")
    inner = fresh.request("stackTrace", {"threadId": 1})
    assert inner["totalFrames"] == depth + 1
    fresh.motion("stepOut")
    frames = fresh.request("stackTrace", {"threadId": 1})["stackFrames"]
    assert len(frames) == depth and frames[0]["line"] == BLOCK_ATTN
    fresh.motion("stepIn")
    fresh.motion("stepOut", {"threadId": 1, "granularity": "line"})  # out of blocks.0: back in GPT.forward, whose
    frames = fresh.request("stackTrace", {"threadId": 1})["stackFrames"]  # loop calls blocks.1 on the same line
    assert len(frames) == depth - 1 and frames[0]["line"] == line_of("x = block(x)")


def test_instruction_granularity_moves_one_tick_each_way(fresh):
    fresh.motion("next", {"threadId": 1, "granularity": "instruction"})
    fresh.motion("next", {"threadId": 1, "granularity": "instruction"})
    assert fresh.position() == 2
    fresh.motion("stepBack", {"threadId": 1, "granularity": "instruction"})
    assert fresh.position() == 1


def test_end_of_program_stops_with_reason_end_and_the_user_can_go_back(fresh):
    mark = fresh.client.mark()
    stop = fresh.motion("continue")
    assert stop["reason"] == "end" and stop["description"] == "end of program"
    assert fresh.position() == fresh.request("timeline", {"count": 0})["end"]
    assert fresh.motion("stepBack")["reason"] == "step" and fresh.top()["line"] == line_of("logits = self.head")
    assert all(name != "terminated" for name, _ in fresh.client.events_since(mark))


def test_restart_goes_back_to_the_entry(fresh):
    fresh.motion("continue")
    assert fresh.motion("restart", {})["reason"] == "entry" and fresh.position() == 0
