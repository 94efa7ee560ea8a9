"""Fast-forward through the wire: a launch asking for it runs its motions ahead (checkpoint.fastForward), and a
breakpoint, a step back and the values read there are those of a launch that keeps every value as it runs."""

from __future__ import annotations

import pytest

from tests.conftest import line_of
from tests.dap.wire import GPT, DapError, Debugger, SchemaCheck

LINE = line_of(GPT, "x = x + self.attn(self.ln1(x))")


def _session(schema: SchemaCheck, fast: bool | None) -> tuple[list, list]:
    debugger = Debugger.spawn(schema)
    try:
        checkpoint = {} if fast is None else {"checkpoint": {"fastForward": fast}}
        debugger.start(GPT, breakpoints=[LINE], **checkpoint)
        seen = []
        for motion in ("continue", "continue", "stepBack", "reverseContinue", "next"):
            stop = debugger.motion(motion)
            seen.append((stop["reason"], debugger.position(), debugger.top()["line"],
                         debugger.evaluate("x")["result"], debugger.evaluate("x.sum()")["result"]))
        return seen, debugger.scope("Locals")
    finally:
        debugger.close()


def test_a_fast_forwarded_launch_stops_steps_back_and_reads_what_a_launch_keeping_every_value_does(schema):
    fast, kept = _session(schema, True), _session(schema, None)
    assert fast == kept
    assert [s[0] for s in fast[0]][:2] == ["breakpoint", "end"]  # the second layer's, then the end


def test_a_fast_forward_setting_that_is_no_boolean_is_refused_naming_the_field(schema):
    debugger = Debugger.spawn(schema)
    try:
        debugger.initialize()
        with pytest.raises(DapError, match="field 'checkpoint.fastForward': input should be a valid boolean"):
            debugger.request("launch", {"program": str(GPT), "checkpoint": {"fastForward": "sometimes"}})
        debugger.start(GPT, breakpoints=[LINE], checkpoint={"fastForward": True})  # the same connection serves on
        assert debugger.motion("continue")["reason"] == "breakpoint"
    finally:
        debugger.close()
