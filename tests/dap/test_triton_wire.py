"""A Triton kernel through the wire (entry kernel): program instances as threads, breakpoints on kernel lines,
instruction steps of one program and back, disassembly at kernel lines, and the race and access checks as
exception stops that fire on their planted kernels only."""

import importlib.util

import pytest

from tests.dap.wire import MODELS, Debugger

KERNELS = MODELS / "kernels"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the kernels extra (triton)")


def line_of(file: str, text: str) -> int:
    return next(i for i, line in enumerate((KERNELS / file).read_text().splitlines(), 1) if text in line)


def start(schema, file: str, filters: list[str] = (), lines: list[int] = ()) -> Debugger:
    debugger = Debugger.spawn(schema)
    debugger.initialize()
    mark = debugger.client.mark()
    debugger.request("launch", {"program": str(KERNELS / file), "entry": "kernel", "stopOnEntry": True})
    debugger.client.wait_for("initialized", after=mark)
    debugger.request("setExceptionBreakpoints", {"filters": list(filters)})
    if lines:
        debugger.set_breakpoints(KERNELS / file, [{"line": n} for n in lines])
    assert debugger.motion("configurationDone", {})["reason"] == "entry"
    return debugger


def step(debugger: Debugger, thread: int, back: bool = False) -> dict:
    return debugger.motion("stepBack" if back else "next", {"threadId": thread, "granularity": "instruction"})


def test_programs_are_threads_and_a_kernel_line_breakpoint_stops_each_at_its_line(schema):
    file = "softmax_fixed.py"
    line = line_of(file, "den = tl.sum")
    debugger = start(schema, file, lines=[line])
    try:
        names = [t["name"] for t in debugger.request("threads")["threads"]]
        assert names == ["host"] + [f"program ({i}, 0, 0)" for i in range(4)]
        stops = [debugger.motion("continue", {"threadId": 1}) for _ in range(2)]
        assert [s["reason"] for s in stops] == ["breakpoint", "breakpoint"]
        assert [s["threadId"] for s in stops] == [2, 3]
        frame = debugger.request("stackTrace", {"threadId": 3})["stackFrames"][0]
        assert frame["line"] == line and frame["source"]["path"] == str(KERNELS / file)
        listing = debugger.request("disassemble", {"memoryReference": frame["instructionPointerReference"],
                                                   "instructionCount": 3})["instructions"]
        assert listing[0]["instruction"].startswith("reduce sum") and listing[0]["line"] == line
        before = debugger.request("stackTrace", {"threadId": 3})["stackFrames"][0]
        step(debugger, 3)
        assert debugger.request("stackTrace", {"threadId": 3})["stackFrames"][0]["line"] > line
        step(debugger, 3, back=True)
        after = debugger.request("stackTrace", {"threadId": 3})["stackFrames"][0]
        assert (after["line"], after["instructionPointerReference"]) == (line, before["instructionPointerReference"])
        back = debugger.motion("reverseContinue", {"threadId": 1})
        assert back["reason"] == "breakpoint" and back["threadId"] == 2
    finally:
        debugger.close()


@pytest.mark.parametrize("file,filt,text,fires", [
    ("sum_race.py", "race", "tl.store(total_ptr", True), ("sum_atomic.py", "race", None, False),
    ("scale_oob.py", "access", "x = tl.load", True), ("scale_fixed.py", "access", None, False),
    ("softmax_padded.py", "access", "tl.store(out_ptr", True), ("softmax_fixed.py", "access", None, False),
])
def test_the_race_and_access_checks_stop_on_planted_kernels_only(schema, file, filt, text, fires):
    debugger = start(schema, file, filters=[filt])
    try:
        stop = debugger.motion("continue", {"threadId": 1})
        if not fires:
            assert stop["reason"] != "exception"
            return
        assert stop["reason"] == "exception"
        info = debugger.request("exceptionInfo", {"threadId": stop["threadId"]})
        assert "program (" in info["description"] and "Python" not in info["description"]
        assert f"line {line_of(file, text)}" in info["description"]
    finally:
        debugger.close()


def test_a_data_breakpoint_on_a_kernel_element_names_the_program_that_wrote_it(schema):
    file = "layernorm_fixed.py"
    debugger = start(schema, file)
    try:
        info = debugger.request("dataBreakpointInfo", {"name": "out_ptr"})
        assert info["dataId"] == "out_ptr"
        [bp] = debugger.request("setDataBreakpoints", {"breakpoints": [{"dataId": "out_ptr[30]"}]})["breakpoints"]
        assert bp["verified"]
        stop = debugger.motion("continue", {"threadId": 1})
        assert stop["reason"] == "data breakpoint" and stop["threadId"] == 3  # program (1, 0, 0): row 1
        assert "program (1, 0, 0) writes out_ptr[30]" in stop["description"]
        frame = debugger.request("stackTrace", {"threadId": 3})["stackFrames"][0]
        assert frame["name"].startswith("program (1, 0, 0): halted")  # the store was its last operation
        assert frame["line"] == line_of(file, "tl.store(out_ptr")  # a finished program stays at its last line
    finally:
        debugger.close()


@pytest.mark.parametrize("file,text,pattern", [
    ("softmax_padded.py", "other=0.0", "padding counted"), ("matmul_tail.py", "a = tl.load", "tail dropped"),
    ("layernorm_stride.py", "row * (stride - 1)", "stride off by one"),
])
def test_the_divergence_filter_stops_a_planted_kernel_at_its_first_wrong_store_naming_the_line(schema, file, text,
                                                                                                pattern):
    debugger = start(schema, file, filters=["divergence"])
    try:
        stop = debugger.motion("continue", {"threadId": 1})
        assert stop["reason"] == "exception" and stop["threadId"] > 1
        info = debugger.request("exceptionInfo", {"threadId": stop["threadId"]})
        assert f"the problem is at line {line_of(file, text)} ({pattern})" in info["description"]
        assert info["details"]["evidence"]["line"] == line_of(file, text)
        frame = debugger.request("stackTrace", {"threadId": stop["threadId"]})["stackFrames"][0]
        assert frame["source"]["path"] == str(KERNELS / file)
    finally:
        debugger.close()


def test_the_divergence_filter_stays_quiet_on_a_fixed_kernel(schema):
    debugger = start(schema, "matmul_fixed.py", filters=["divergence"])
    try:
        assert debugger.motion("continue", {"threadId": 1})["reason"] == "end"
    finally:
        debugger.close()
