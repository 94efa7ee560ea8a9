"""A Triton kernel through the wire (entry kernel): program instances as threads, breakpoints on kernel lines,
instruction steps of one program and back, line steps of one program to its next kernel line and back,
disassembly at kernel lines, the race and access checks as exception stops that fire on their planted kernels only,
`locate` of a kernel tensor or element with the programs that wrote and read it, and the console stopping at the
program's own kernel line."""

import base64
import importlib.util
import struct

import pytest

from tests.dap.wire import MODELS, Debugger, refused, rewind

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


def locate(debugger: Debugger, name: str) -> dict:
    return debugger.request("locate", {"name": name, "frameId": 1})


def element_value(debugger: Debugger, address: int) -> float:
    """The float32 at a `global` address as readMemory reads it at the position."""
    data = debugger.request("readMemory", {"memoryReference": f"{address:#x}", "count": 4})["data"]
    return struct.unpack("<f", base64.b64decode(data))[0]


def test_locate_of_a_kernel_element_names_its_address_and_the_write_before_the_position(schema):
    file = "layernorm_fixed.py"
    debugger = start(schema, file)
    try:
        whole = locate(debugger, "out_ptr")["shards"][0]
        before = locate(debugger, "out_ptr[30]")
        assert before["value"] == "out_ptr" and before["shards"][0]["address"] == whole["address"] + 30 * 4
        found = before["kernel"]
        assert (found["dtype"], found["nbytes"], found["index"], found["steps"]) == ("float32", 4, [1, 6], 0)
        assert found["lastWrite"] is None and found["writes"] == [] and found["totalWrites"] == 0
        assert "no program has written out_ptr[30] yet" in found["lastWriteReason"]
        debugger.request("setDataBreakpoints", {"breakpoints": [{"dataId": "out_ptr[30]"}]})
        stop = debugger.motion("continue", {"threadId": 1})
        assert stop["reason"] == "data breakpoint"
        found = locate(debugger, "out_ptr[30]")["kernel"]
        last = found["lastWrite"]
        assert (last["thread"], last["program"], last["kind"], last["atomic"]) == ("program (1, 0, 0)", [1, 0, 0],
                                                                                   "store", False)
        assert last["line"] == line_of(file, "tl.store(out_ptr") and last["step"] == found["steps"] - 1
        assert last["value"] == element_value(debugger, found["address"])  # what the element holds now
        assert found["writes"] == [last] and found["totalWrites"] == 1
        assert found["lastRead"] is None and "no program has read out_ptr[30]" in found["lastReadReason"]
        step(debugger, stop["threadId"], back=True)  # before the store: it has not happened at this position
        assert locate(debugger, "out_ptr[30]")["kernel"]["lastWrite"] is None
        read = locate(debugger, "x_ptr[30]")["kernel"]["lastRead"]  # the same row's load, earlier in that program
        assert read["thread"] == "program (1, 0, 0)" and read["line"] == line_of(file, "x = tl.load")
        assert read["value"] == element_value(debugger, locate(debugger, "x_ptr[30]")["kernel"]["address"])
    finally:
        debugger.close()


@pytest.mark.parametrize("file,kind,atomic", [("sum_race.py", "store", False), ("sum_atomic.py", "atomic", True)])
def test_locate_of_an_accumulator_lists_every_programs_write_and_the_last_read(schema, file, kind, atomic):
    debugger = start(schema, file)
    try:
        assert debugger.motion("continue", {"threadId": 1})["reason"] == "end"
        found = locate(debugger, "total_ptr[0]")["kernel"]
        assert [w["thread"] for w in found["writes"]] == [f"program ({i}, 0, 0)" for i in range(4)]
        assert {(w["kind"], w["atomic"]) for w in found["writes"]} == {(kind, atomic)}
        assert found["lastWrite"] == found["writes"][-1] and found["totalWrites"] == 4
        assert found["lastRead"]["thread"] == "program (3, 0, 0)" and found["steps"] == found["launchSteps"]
        assert found["lastWrite"]["value"] == element_value(debugger, found["address"])
    finally:
        debugger.close()


def test_locate_of_a_kernel_tensor_says_which_programs_wrote_which_element_ranges_so_far(schema):
    debugger = start(schema, "layernorm_fixed.py")
    try:
        debugger.request("setDataBreakpoints", {"breakpoints": [{"dataId": "out_ptr[30]"}]})
        debugger.motion("continue", {"threadId": 1})  # right after program (1, 0, 0) stored its row
        found = locate(debugger, "out_ptr")["kernel"]
        assert [(w["thread"], w["ranges"]) for w in found["writers"]] == [("program (0, 0, 0)", [[0, 24]]),
                                                                            ("program (1, 0, 0)", [[24, 48]])]
        assert (found["written"], found["elements"], found["totalWriters"]) == (48, 144, 2)
        debugger.request("setDataBreakpoints", {"breakpoints": []})
        assert debugger.motion("continue", {"threadId": 1})["reason"] == "end"
        after = locate(debugger, "out_ptr_after")
        assert after["value"] == "out_ptr_after"
        assert [w["ranges"] for w in after["kernel"]["writers"]] == [[[24 * i, 24 * (i + 1)]] for i in range(6)]
        assert locate(debugger, "x_ptr")["kernel"]["writers"] == []  # an input: read, never written
    finally:
        debugger.close()


NOT_ELEMENTS = [  # a name given to locate, and the words that refuse it
    ("out_ptr[144]", "out_ptr has 144 element(s), flat indices 0..143"),
    ("out_ptr[-1]", "a flat index counts from 0"),
    ("out_ptr[1.5]", "its flat index, a whole number"), ("out_ptr[abc]", "its flat index, a whole number"),
    ("out_ptr[]", "its flat index, a whole number"), ("out_ptr[1, 2]", "its flat index, a whole number"),
    ("out_ptr[3", "its flat index, a whole number"), ("out_ptr[3][4]", "its flat index, a whole number"),
    ("out_ptr[\u0663]", "its flat index, a whole number"),  # a digit, but not one of 0-9
    ("out_ptr[" + "9" * 5000 + "]", "out_ptr has 144 element(s)"),
    ("nothing_here[3]", "'nothing_here' is not a tensor of the kernel: its tensors are x_ptr, w_ptr, out_ptr"),
]


def test_locate_refuses_a_name_that_is_no_kernel_element_in_words_and_keeps_serving(schema):
    debugger = start(schema, "layernorm_fixed.py")
    try:
        for name, words in NOT_ELEMENTS:
            refused(debugger, "locate", {"name": name, "frameId": 1}, words)
            [bp] = debugger.request("setDataBreakpoints", {"breakpoints": [{"dataId": name}]})["breakpoints"]
            assert not bp["verified"] and words in bp["message"], name  # the same spelling, the same words
            assert locate(debugger, "out_ptr[143]")["kernel"]["element"] == 143
        refused(debugger, "locate", {"name": "nothing_here", "frameId": 1}, "'nothing_here' is not a variable")
    finally:
        debugger.close()


def frame_of(debugger: Debugger, thread: int) -> dict:
    return debugger.request("stackTrace", {"threadId": thread})["stackFrames"][0]


def instruction_line(debugger: Debugger, frame: dict, offset: int = 0) -> int:
    """The kernel line of the program's instruction `offset` from its next one (disassemble)."""
    [ins] = debugger.request("disassemble", {"memoryReference": frame["instructionPointerReference"],
                                             "instructionOffset": offset, "instructionCount": 1})["instructions"]
    return ins["line"]


def test_next_on_a_program_thread_steps_it_to_its_next_kernel_line_in_both_directions(schema):
    file = "softmax_fixed.py"
    den, store = line_of(file, "den = tl.sum"), line_of(file, "tl.store(out_ptr")
    debugger = start(schema, file, lines=[den])
    try:
        assert debugger.motion("continue", {"threadId": 1})["threadId"] == 2
        at_den = frame_of(debugger, 2)
        for command in ("next", "stepIn"):  # default granularity: a kernel line of program (0, 0, 0)
            stop = debugger.motion(command, {"threadId": 2})
            assert stop["reason"] == "step" and stop["threadId"] == 2
            frame = frame_of(debugger, 2)
            assert frame["line"] == store and frame["source"]["path"] == str(KERNELS / file)
            assert instruction_line(debugger, frame) == store and instruction_line(debugger, frame, -1) == den
            assert frame_of(debugger, 3)["name"].startswith("program (1, 0, 0) pc 0:")  # the others did not run
            debugger.motion("stepBack", {"threadId": 2})  # to where the line before began: the breakpoint's place
            assert frame_of(debugger, 2)["instructionPointerReference"] == at_den["instructionPointerReference"]
        debugger.request("setBreakpoints", {"source": {"path": str(KERNELS / file)}, "breakpoints": []})
        debugger.motion("next", {"threadId": 2})
        debugger.motion("next", {"threadId": 2})  # the store is its last line: on to the program's end
        assert frame_of(debugger, 2)["name"].startswith("program (0, 0, 0): halted")
        back = debugger.motion("stepBack", {"threadId": 2})
        assert back["threadId"] == 2 and frame_of(debugger, 2)["line"] == store
        assert instruction_line(debugger, frame_of(debugger, 2), -1) == den  # the start of the store's line
    finally:
        debugger.close()


def test_next_on_the_host_thread_steps_over_the_whole_launch(schema):
    debugger = start(schema, "softmax_fixed.py")
    try:
        assert debugger.motion("next", {"threadId": 1})["reason"] == "end"
        timeline = debugger.request("timeline", {"count": 0})
        assert timeline["position"] == timeline["end"] == 1  # past the launch, its one node
    finally:
        debugger.close()


def test_the_console_shows_the_stopping_programs_kernel_line_and_steps_and_locates_there(tmp_path):
    file = KERNELS / "softmax_fixed.py"
    den, store = line_of(file.name, "den = tl.sum"), line_of(file.name, "tl.store(out_ptr")
    script = tmp_path / "kernel.rewind"
    script.write_text(f"break {file.name}:{den}\ncontinue\nnext\nlocate out_ptr[12]\ncontinue\nlocate out_ptr\n"
                      "locate out_ptr[40]\nquit\n")
    run = rewind("debug", str(file), "--entry", "kernel", "-x", str(script))
    out = run.stdout
    assert f"(rewind) continue\n[tick 0] breakpoint 1 at {file.name}:{den}: program (0, 0, 0) pc " in out
    assert f"\n  {file.name}:{den}  den = tl.sum(num, axis=0)\n(rewind) next\n" in out  # its line, not the launch's
    after_next = out.split("(rewind) next\n")[1]
    assert after_next.split("\n")[1].startswith(f"  {file.name}:{store}  tl.store(out_ptr")
    assert "program (0, 0, 0) pc" in after_next.split("\n")[0]
    assert "  last write: no program has written out_ptr[12] in the " in out  # row 1: program (1, 0, 0)'s, not yet
    second = out.split("(rewind) continue\n")[2]
    assert second.startswith(f"[tick 0] breakpoint 1 at {file.name}:{den}: program (1, 0, 0) pc ")
    assert "  10 of 40 element(s) written" in second and "  program (0, 0, 0) wrote 10 element(s): 0..9 (line" in second
    assert "error: 'out_ptr[40]' names no element: out_ptr has 40 element(s)" in out
    assert "Error" not in out and run.returncode == 1  # the refused locate is the one failure
