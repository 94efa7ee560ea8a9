"""Frames and scopes through the wire: the writer at a stop on a write, every frame's own scopes and names
(a module's arguments, its callers'), locals of the frame shown at the end, and the console's up, down, frame."""

import json

import pytest

from tests.dap.wire import MODELS, DapError, Debugger, named, rewind

NAMES = MODELS / "frames_names.py"
HF = MODELS / "hf_tiny.py"
LINES = NAMES.read_text().splitlines()


def line(text: str) -> int:
    return next(i + 1 for i, source in enumerate(LINES) if text in source)


def server(schema, entry: str, path=NAMES):
    debugger = Debugger.spawn(schema)
    assert debugger.start(path, stopOnEntry=True, entry=entry)["reason"] == "entry"
    return debugger


@pytest.fixture(scope="module")
def zero_row(schema):
    debugger = server(schema, "zero_row")
    yield debugger
    debugger.close()


@pytest.fixture(scope="module")
def names(schema):
    debugger = server(schema, "build")
    yield debugger
    debugger.close()


def frames(debugger) -> list[dict]:
    return debugger.request("stackTrace", {"threadId": 1})["stackFrames"]


def error(debugger, command: str, arguments: dict) -> str:
    with pytest.raises(DapError) as caught:
        debugger.request(command, arguments)
    return caught.value.message


def test_a_nan_stop_shows_the_writer_at_its_line_and_steps_from_it(zero_row):
    zero_row.reset(NAMES)
    stop = zero_row.motion("continue")
    assert stop["reason"] == "exception"
    q = zero_row.position()
    stack = frames(zero_row)
    assert [(f["name"], f["line"]) for f in stack] == [
        ("mul_1 (after write) (aten.mul) [block.norm]", line("return x * torch.rsqrt")),
        ("Block.forward [block]", line("h = self.norm(h * 2)")),
        ("Model.forward [<root>]", line("outputs = self.block"))]
    info = zero_row.request("exceptionInfo", {"threadId": 1})
    assert info["details"]["node"] == "mul_1" and info["details"]["source"].endswith(f":{line('return x * torch')}")
    node = zero_row.scope("Node")  # the writer's node: its output is written
    assert named(node, "mul_1")["value"].startswith("float32[2, 8] cpu") and "nan=8" in named(node, "mul_1")["value"]
    assert [v["name"] for v in zero_row.scope("Locals")] == ["x", "scale"]
    zero_row.motion("next")  # forward: the next node, about to run; nothing ran
    assert zero_row.position() == q
    assert (zero_row.top()["name"], zero_row.top()["line"]) == ("linear (aten.linear) [block.attn]",
                                                                line("weights = torch.softmax"))
    zero_row.reset(NAMES)
    zero_row.motion("continue")  # the NaN again
    assert zero_row.top()["name"].startswith("mul_1 (after write)")
    zero_row.motion("stepBack")  # back: the instant before the write
    assert zero_row.position() == q - 1
    assert (zero_row.top()["name"], zero_row.top()["line"]) == ("mul_1 (aten.mul) [block.norm]",
                                                                line("return x * torch.rsqrt"))
    assert named(zero_row.scope("Node"), "mul_1")["value"].startswith("<not written yet")


def test_a_data_breakpoint_stop_shows_the_writer(names):
    names.reset(NAMES)
    names.request("setDataBreakpoints", {"breakpoints": [{"dataId": "mean"}]})
    assert names.motion("continue")["reason"] == "data breakpoint"
    assert (names.top()["name"], names.top()["line"]) == ("mean (after write) (aten.mean) [block.norm]",
                                                          line("scale = x.pow(2)"))
    assert names.evaluate("scale")["result"] == named(names.scope("Node"), "mean")["value"]  # written now


def test_every_frame_of_the_stack_has_its_own_scopes_and_names(names):
    names.reset(NAMES)
    names.request("setFunctionBreakpoints", {"breakpoints": [{"name": "block.attn"}]})
    assert names.motion("continue")["reason"] == "function breakpoint"
    stack = frames(names)
    assert [f["name"] for f in stack] == ["linear (aten.linear) [block.attn]", "Block.forward [block]",
                                          "Model.forward [<root>]"]
    attn, block, model = (f["id"] for f in stack)
    assert [s["name"] for s in names.request("scopes", {"frameId": block})["scopes"]] == [
        "Arguments", "Locals", "Live values", "Parameters"]
    assert [v["name"] for v in names.scope("Arguments", attn)] == ["hidden"]
    assert [v["name"] for v in names.scope("Locals", attn)] == ["hidden"]
    (argument,) = names.scope("Arguments", block)  # Block.forward(self, h), called with the model's x
    assert argument["name"] == "h" and argument["evaluateName"] == "x"  # h has been rebound since
    assert [v["name"] for v in names.scope("Locals", block)] == ["h", "residual"]
    assert [v["name"] for v in names.scope("Locals", model)] == ["x"]
    # evaluate, locate and provenance read the frame they are given
    assert names.evaluate("h", frame_id=block)["result"] == names.evaluate("hidden", frame_id=attn)["result"]
    assert names.request("locate", {"name": "residual", "frameId": block})["value"] == "x"
    assert names.request("provenance", {"name": "h", "frameId": block})["value"] == "mul_1"
    assert names.evaluate("x", frame_id=model)["result"] == names.evaluate("residual", frame_id=block)["result"]
    message = error(names, "evaluate", {"expression": "x", "frameId": attn, "context": "repl"})
    assert message == ("name 'x' is not defined at this tick in Attention.forward [block.attn]: it is a variable "
                       "of Model.forward [<root>] (frame 2, a caller)")
    assert "not defined at this tick in Attention.forward" in error(names, "locate", {"name": "x", "frameId": attn})
    message = error(names, "evaluate", {"expression": "attn_output", "frameId": block, "context": "repl"})
    assert message == (f"name 'attn_output' is not defined at this tick in Block.forward [block]: line "
                       f"{line('attn_output, _ = self.attn(h)')} assigns it and has not run yet")


def test_at_the_end_locals_belong_to_the_frame_shown(schema):
    debugger = server(schema, "wrapped")
    try:
        debugger.request("setExceptionBreakpoints", {"filters": []})
        assert debugger.motion("continue")["reason"] == "end"
        stack = frames(debugger)
        assert [(f["name"], f["line"]) for f in stack] == [
            ("linear_2 (aten.linear) [model]", line("return self.head")),
            ("Wrapper.forward [<root>]", line("return self.model(x * 2)"))]
        assert [v["name"] for v in debugger.scope("Locals")] == ["x", "hidden"]
        inner = debugger.evaluate("x.sum()")["result"]  # Model.forward's x: the wrapper's x * 2
        outer = debugger.evaluate("x.sum()", frame_id=stack[1]["id"])["result"]
        assert float(inner.rsplit("=", 1)[1]) == pytest.approx(2 * float(outer.rsplit("=", 1)[1]), rel=1e-4)
    finally:
        debugger.close()


def test_a_llama_norm_breakpoint_shows_the_norm_input_and_the_callers_names(schema):
    debugger = server(schema, "llama", HF)
    try:
        debugger.request("setFunctionBreakpoints", {"breakpoints": [{"name": "model.norm"}]})
        assert debugger.motion("continue")["reason"] == "function breakpoint"
        stack = frames(debugger)
        source = debugger.request("source", {"source": stack[0]["source"]})["content"].splitlines()
        assert source[stack[0]["line"] - 1].strip().startswith("variance = hidden_states.pow(2)")
        hidden = debugger.evaluate("hidden_states")
        assert hidden["result"].startswith("float32[1, 8, 32] cpu")
        value = debugger.request("provenance", {"name": "hidden_states", "frameId": stack[0]["id"]})["value"]
        assert debugger.request("locate", {"name": "hidden_states"})["value"] == value
        assert [v["name"] for v in debugger.scope("Arguments")] == ["hidden_states"]
        assert debugger.evaluate("hidden_states", frame_id=stack[1]["id"])["result"] == hidden["result"]
        assert debugger.evaluate("inputs_embeds", frame_id=stack[1]["id"])["result"].startswith("float32[1, 8, 32]")
        assert "it is a variable of LlamaModel.forward [model] (frame 1, a caller)" in error(
            debugger, "evaluate", {"expression": "inputs_embeds", "frameId": stack[0]["id"], "context": "repl"})
    finally:
        debugger.close()


def test_the_console_goes_up_and_down_the_stack():
    script = "\n".join([
        "break block.attn", "continue", "print hidden.shape", "print x", "up", "print residual.shape", "locals",
        "prov h", "up", "print x.shape", "up", "where", "frame 1", "locate residual", "down", "down", "frame 7",
        "frame one", "frame 2", "next", "print hidden.shape", "quit"]) + "\n"
    run = rewind("debug", str(NAMES), "--json", stdin=script)
    records = {i: r for i, r in enumerate(json.loads(text) for text in run.stdout.splitlines())}
    by_command = [(r["command"], r) for r in records.values()]
    result = lambda i: by_command[i][1]  # noqa: E731  (record 0 is the launch)
    assert result(3)["result"]["result"] == "torch.Size([2, 8])"
    assert result(4)["error"].startswith("name 'x' is not defined at this tick in Attention.forward [block.attn]")
    assert result(5)["result"]["frame"] == 1 and result(5)["result"]["name"] == "Block.forward [block]"
    assert result(6)["result"]["result"] == "torch.Size([2, 8])"  # Block's residual
    assert set(result(7)["result"]["locals"]) == {"h", "residual"}
    assert result(8)["result"]["value"] == "mul_1"  # Block's h: the norm's result
    assert result(9)["result"]["frame"] == 2 and result(10)["ok"]  # Model.forward has x
    assert result(11)["error"] == "no frame #3: the stack has 3 frame(s), #0 (innermost) to #2 (outermost)"
    assert result(12)["result"]["selected"] == 2
    assert result(13)["result"]["frame"] == 1 and result(14)["result"]["value"] == "x"
    assert result(15)["result"]["frame"] == 0
    assert result(16)["error"].startswith("already at the innermost frame (#0)")
    assert result(17)["error"].startswith("no frame #7") and result(18)["error"].startswith("usage: frame N")
    assert result(19)["result"]["frame"] == 2
    assert result(21)["result"]["result"] == "torch.Size([2, 8])"  # a stop selects #0 again
    assert run.returncode == 1  # commands failed
