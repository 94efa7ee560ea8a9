"""Damaged and crafted traces through the wire: a recording cut short launches with a note saying where it
ends, and then every request answers or says, in plain words, what the recording lacks; a trace whose op
names a Python function is refused naming the op, and the server keeps serving."""

from __future__ import annotations

import pytest

from checkpoint.trace import PROGRAM
from dap_server.client import DapError
from tests.dap.wire import Debugger
from tests.test_trace_trust import assert_clear, boundaries, build, crafted, frames_of, mlp_trace, node_of

__all__ = ["mlp_trace"]  # the fixture: a saved trace of examples/mlp.py


def said_to_user(debugger: Debugger) -> list[str]:
    """Every text the server showed: output events, stop descriptions, error messages."""
    texts = []
    for m in debugger.messages:
        body = m.get("body") or {}
        if m.get("type") == "event" and m.get("event") == "output":
            texts.append(body.get("output", ""))
        elif m.get("type") == "event" and m.get("event") == "stopped":
            texts.append(body.get("description", "") or "")
        elif m.get("type") == "response" and not m.get("success"):
            texts.append(m.get("message", "") + " " + str((body.get("error") or {}).get("format", "")))
    return texts


def test_a_cut_short_trace_launches_with_a_note_and_every_request_answers_clearly(schema, mlp_trace, tmp_path):
    third_step = [o for o, k in boundaries(mlp_trace) if k == "step"][2]
    path = tmp_path / "cut.rwtrace"
    path.write_bytes(mlp_trace[:third_step + 5])  # inside the third step's frame: two steps are whole
    debugger = Debugger.spawn(schema)
    debugger.initialize(supportsProgressReporting=True)
    mark = debugger.client.mark()
    body = debugger.request("launch", {"trace": str(path)})
    note = "the recording ends at tick 2 of 5: it was cut short"
    assert any(note in n for n in body["notes"]), body
    debugger.client.wait_for("output", lambda b: note in b.get("output", ""), after=mark)
    debugger.client.wait_for("initialized", after=mark)

    stop = debugger.motion("configurationDone", {})  # runs on: past tick 2 the recording has nothing
    assert stop["reason"] == "exception" and "needs the device that recorded it" in stop["description"]
    assert debugger.position() == 2
    for motion, position in (("stepBack", 0), ("next", 2), ("reverseContinue", 0), ("continue", 2)):
        debugger.motion(motion)
        assert debugger.position() == position, motion
        frames = debugger.request("stackTrace", {"threadId": 1})["stackFrames"]
        for scope in debugger.request("scopes", {"frameId": frames[0]["id"]})["scopes"]:
            for variable in debugger.variables(scope["variablesReference"]):
                assert variable["value"]
    assert debugger.request("timeline", {"count": 10})["position"] == 2
    for text in said_to_user(debugger):
        assert_clear(text)
        assert "a bug in Rewind" not in text
    debugger.close()


@pytest.mark.parametrize("op", ["import_module.__call__.__call__", "load_library.__call__.__call__"])
def test_a_trace_whose_op_names_a_python_function_is_refused_naming_the_op(schema, mlp_trace, tmp_path, op):
    def poison(program: dict) -> dict:
        node_of(program, "relu")["op"] = op
        return program
    path = tmp_path / "crafted.rwtrace"
    path.write_bytes(build(crafted(frames_of(mlp_trace), PROGRAM, poison)))
    debugger = Debugger.spawn(schema)
    debugger.initialize()
    with pytest.raises(DapError) as refused:
        debugger.request("launch", {"trace": str(path)})
    message = refused.value.message
    assert f"node 1 'relu' names op '{op}', which is not a registered torch operator" in message
    assert str(path) in message
    assert_clear(message)
    whole = tmp_path / "whole.rwtrace"
    whole.write_bytes(mlp_trace)
    assert not debugger.request("launch", {"trace": str(whole)})  # still serving; a whole trace has no notes
    assert debugger.request("threads")["threads"]
    debugger.close()
