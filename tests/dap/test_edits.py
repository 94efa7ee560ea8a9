"""Edits through the wire: setVariable and writeMemory are recorded steps on the timeline, undone by stepping back.

Edits stay in the schedule (they are the future of this timeline), so these tests get a server of their own."""

import base64
import struct

import pytest

from tests.dap.wire import GPT, DapError, Debugger, line_of, named

MASK = line_of("mask = torch.ones")


@pytest.fixture(scope="module")
def edited(schema):
    debugger = Debugger.spawn(schema)
    debugger.start(GPT, breakpoints=[MASK])
    yield debugger
    debugger.close()


def element_container(debugger: Debugger) -> int:
    """The variablesReference whose children are div[0, 0, 0, :] (div is `scores` in the source)."""
    ref = named(debugger.scope("Live values"), "div")["variablesReference"]
    for _ in range(3):
        ref = debugger.variables(ref, filter="indexed", start=0, count=1)[0]["variablesReference"]
    return ref


def test_set_variable_is_undone_by_step_back(edited):
    position = edited.position()
    original = edited.number("scores[0, 0, 0, 1]")
    mark = edited.client.mark()
    answer = edited.request("setVariable", {"variablesReference": element_container(edited), "name": "[1]",
                                            "value": "2.5 * 4"})
    assert answer["value"] == "10"
    stop = edited.client.wait_for("stopped", after=mark)  # the edit is a step: the client hears where it stands
    assert stop["reason"] == "step" and "edit" in stop["description"]
    assert edited.number("scores[0, 0, 0, 1]") == 10.0
    edit = edited.request("timeline", {"start": position, "count": 1})["ticks"][0]
    assert edited.position() == position + 1 and edit["node"] is None and edit["op"] == "edit"
    assert edited.motion("stepBack")["reason"] == "step" and edited.position() == position
    assert edited.number("div[0, 0, 0, 1]") == original


def test_write_memory_is_undone_by_step_back(edited):
    reference = named(edited.scope("Live values"), "div")["memoryReference"]
    position = edited.position()
    mark = edited.client.mark()
    answer = edited.request("writeMemory", {"memoryReference": reference, "offset": 8,
                                            "data": base64.b64encode(struct.pack("<f", -3.5)).decode()})
    assert answer["bytesWritten"] == 4
    assert edited.client.wait_for("stopped", after=mark)["reason"] == "step"
    assert edited.number("div[0, 0, 0, 2]") == -3.5
    assert ("memory", {"memoryReference": reference, "offset": 8, "count": 4}) in edited.client.events_since(mark)
    edited.motion("stepBack")
    assert edited.position() == position and edited.number("div[0, 0, 0, 2]") != -3.5
    with pytest.raises(DapError, match="outside 'div'"):
        edited.request("writeMemory", {"memoryReference": reference, "offset": 4094, "data": "AAAAAA=="})
    partial = edited.request("writeMemory", {"memoryReference": reference, "offset": 4094, "allowPartial": True,
                                             "data": "AAAAAA=="})
    assert partial["bytesWritten"] == 2
    with pytest.raises(DapError, match="not base64"):
        edited.request("writeMemory", {"memoryReference": reference, "data": "***"})


def test_set_variable_refuses_what_is_not_an_element(edited):
    scopes = edited.request("scopes", {"frameId": 1})["scopes"]
    live_ref = next(s["variablesReference"] for s in scopes if s["name"] == "Live values")
    with pytest.raises(DapError, match="expand it and set one element"):
        edited.request("setVariable", {"variablesReference": live_ref, "name": "div", "value": "1"})
    div_ref = named(edited.variables(live_ref), "div")["variablesReference"]
    with pytest.raises(DapError, match="is not an element"):
        edited.request("setVariable", {"variablesReference": div_ref, "name": "stats", "value": "1"})
    with pytest.raises(DapError, match="not allowed"):
        edited.request("setVariable", {"variablesReference": element_container(edited), "name": "[0]",
                                       "value": "__import__('os')"})
