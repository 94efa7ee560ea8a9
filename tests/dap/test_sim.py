"""The sim chip through the wire: units as threads, instruction steps of one unit (or of it alone) and
back, disassemble, instruction breakpoints, memory by physical address, and race and hang stops."""

import base64

import pytest

from dap_server.client import DapError
from tests.dap.wire import GPT, Debugger

DROPPED_BARRIER = [{"kind": "drop_barrier", "node": "layer_norm_1", "unit": "core 2"}]
MISCOUNTED_BARRIER = [{"kind": "miscount_barrier", "node": "softmax_1"}]


@pytest.fixture(scope="module")
def chip(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(GPT, driver="sim", stopOnEntry=True)["reason"] == "entry"
    yield debugger
    debugger.close()


def relaunch(debugger: Debugger, filters: list[str], **launch) -> dict:
    """Load the GPT on the sim chip afresh (with `launch` options) and run to the first stop."""
    debugger.request("setExceptionBreakpoints", {"filters": filters})
    return debugger.motion("restart", {"arguments": {"program": str(GPT), "driver": "sim"} | launch})


def thread_of(debugger: Debugger, name: str) -> int:
    return next(t["id"] for t in debugger.request("threads")["threads"] if t["name"] == name)


def step(debugger: Debugger, thread: int, back: bool = False, alone: bool = False) -> dict:
    return debugger.motion("stepBack" if back else "next", {"threadId": thread, "granularity": "instruction",
                                                            "singleThread": alone})


def units(debugger: Debugger) -> dict:
    return {u["name"]: u for u in debugger.request("units", {})["units"]}


def read(debugger: Debugger, address: int, count: int) -> bytes:
    body = debugger.request("readMemory", {"memoryReference": f"{address:#x}", "count": count})
    return base64.b64decode(body.get("data", ""))


def test_threads_are_the_host_and_every_core_and_dma_engine(chip):
    names = [t["name"] for t in chip.request("threads")["threads"]]
    assert names[0] == "host" and len(names) == 65
    assert names[13] == "core 12 (gang 1)" and names[45] == "dma 12 (gang 1)"


def test_a_units_instruction_steps_move_its_stack_and_stepping_back_restores_its_memory(chip):
    relaunch(chip, [], stopOnEntry=True)
    core = thread_of(chip, "core 3 (gang 0)")
    assert step(chip, core)["threadId"] == core
    frame = chip.request("stackTrace", {"threadId": core})["stackFrames"][0]
    assert frame["name"].startswith("core 3 (gang 0) pc 1") and frame["source"]["path"] == str(GPT)
    assert frame["id"] != chip.top()["id"]  # frame ids are unique across threads
    listing = chip.request("disassemble", {"memoryReference": frame["instructionPointerReference"],
                                           "instructionOffset": -2, "instructionCount": 5})["instructions"]
    assert listing[0]["presentationHint"] == "invalid" and listing[2]["address"] == frame["instructionPointerReference"]
    assert listing[1]["instruction"].startswith("dma.ld") and listing[1]["symbol"].startswith("embedding")
    tile = 0x1000_0000 + 3 * 0x10_0000
    before, position = read(chip, tile, 64), chip.request("units", {})["instruction"]
    for _ in range(40):  # steps of the whole interleaving (the host's thread): every unit as recorded
        step(chip, 1)
    assert read(chip, tile, 64) != before  # core 3's DMA engine has landed its token ids
    for _ in range(40):
        step(chip, 1, back=True)
    assert chip.request("units", {})["instruction"] == position and read(chip, tile, 64) == before


def test_a_single_thread_step_moves_that_unit_alone(chip):
    relaunch(chip, [], stopOnEntry=True)
    core = thread_of(chip, "core 9 (gang 1)")
    before = units(chip)
    step(chip, core, alone=True)
    after = units(chip)
    assert after["core 9 (gang 1)"]["pc"] == before["core 9 (gang 1)"]["pc"] + 1
    assert all(after[n]["pc"] == u["pc"] for n, u in before.items() if n.startswith("core") and n != "core 9 (gang 1)")
    refused = step(chip, thread_of(chip, "dma 0 (gang 0)"), alone=True)  # a motion's failure is a stop
    assert refused["reason"] == "exception" and "cannot step alone" in refused["description"]
    assert "queue" in refused["description"] or "idle" in refused["description"]


def test_an_instruction_breakpoint_from_the_disassembly_stops_that_unit_before_it(chip):
    relaunch(chip, [], stopOnEntry=True)
    core = thread_of(chip, "core 0 (gang 0)")
    step(chip, core)
    pointer = chip.request("stackTrace", {"threadId": core})["stackFrames"][0]["instructionPointerReference"]
    later = chip.request("disassemble", {"memoryReference": pointer, "instructionOffset": 2,
                                         "instructionCount": 1})["instructions"][0]
    bps = chip.request("setInstructionBreakpoints", {"breakpoints": [
        {"instructionReference": later["address"]}, {"instructionReference": "0x42"}]})["breakpoints"]
    assert bps[0]["verified"] and bps[0]["line"] == later["line"]
    assert not bps[1]["verified"] and "no instruction at 0x42" in bps[1]["message"]
    stop = chip.motion("continue", {"threadId": 1})
    assert stop["reason"] == "instruction breakpoint" and stop["hitBreakpointIds"] == [bps[0]["id"]]
    assert stop["threadId"] == core
    frame = chip.request("stackTrace", {"threadId": core})["stackFrames"][0]
    assert frame["instructionPointerReference"] == later["address"]
    again = relaunch(chip, [])  # instruction breakpoints stay across a restart, bound to the new run's code
    assert again["reason"] == "instruction breakpoint" and again["hitBreakpointIds"] == [bps[0]["id"]]
    chip.request("setInstructionBreakpoints", {"breakpoints": []})


def test_a_race_stops_with_both_units_and_steps_back_to_the_instant_before_the_second_access(chip):
    stop = relaunch(chip, ["race"], faults=DROPPED_BARRIER)
    assert stop["reason"] == "exception" and stop["text"] == "Race"
    info = chip.request("exceptionInfo", {"threadId": stop["threadId"]})
    race = info["details"]["evidence"]
    assert info["exceptionId"] == "race" and race["node"] == "layer_norm_1"
    assert race["tensor"] == "partial sums of layer_norm_1" and len(race["instructions"]) == 2
    second = race["instructions"][1]
    assert stop["threadId"] == thread_of(chip, second["unit"])
    start, end = (int(a, 16) for a in race["addressRange"])
    assert len(read(chip, start, end - start)) == end - start
    step(chip, 1, back=True)
    about_to = units(chip)[second["unit"]]
    assert about_to["status"] in ("ready", "busy") and second["instruction"].split()[0] in about_to["detail"]
    again = chip.motion("continue", {"threadId": 1})  # the recorded schedule replays the race
    assert again["reason"] == "exception" and again["description"] == stop["description"]


def test_a_hang_stops_with_the_wait_for_graph_and_steps_back_to_the_last_progress(chip):
    stop = relaunch(chip, ["hang"], faults=MISCOUNTED_BARRIER)
    assert stop["reason"] == "exception" and stop["text"] == "Hang"
    hang = chip.request("exceptionInfo", {"threadId": stop["threadId"]})["details"]["evidence"]
    assert hang["node"] == "softmax_1" and len(hang["waitFor"]) == 8
    assert {w["waitsOn"] for w in hang["waitFor"]} == {"barrier 0"}
    assert all(u["status"] != "ready" for u in units(chip).values())
    step(chip, 1, back=True)
    assert chip.request("units", {})["instruction"] == hang["lastProgress"]


def test_bad_sim_launch_options_are_errors_that_name_them(chip):
    with pytest.raises(DapError, match="schedule"):
        chip.request("restart", {"arguments": {"program": str(GPT), "driver": "sim", "schedule": "fifo"}})
    with pytest.raises(DapError, match="kind 'flip' is not one of"):
        chip.request("restart", {"arguments": {"program": str(GPT), "driver": "sim",
                                                "faults": [{"kind": "flip", "node": "add"}]}})


def test_instruction_requests_on_the_torch_driver_say_why_they_cannot_work(chip):
    relaunch(chip, [], stopOnEntry=True, driver="torch:cpu")
    with pytest.raises(DapError, match="runs nodes, not instruction streams"):
        chip.request("disassemble", {"memoryReference": "0x10000000000", "instructionCount": 4})
    with pytest.raises(DapError, match="runs nodes, not instruction streams"):
        chip.request("setInstructionBreakpoints", {"breakpoints": [{"instructionReference": "0x10000000000"}]})
    # VS Code clears instruction breakpoints at every launch: none to clear is no error (it was a toast on torch)
    assert chip.request("setInstructionBreakpoints", {"breakpoints": []}) == {"breakpoints": []}
    with pytest.raises(DapError, match="does not name a value"):
        chip.request("readMemory", {"memoryReference": "0x80000000", "count": 4})


def test_variables_show_a_values_shards_with_their_units_and_element_slices(chip):
    relaunch(chip, [], stopOnEntry=True)
    chip.motion("goto", {"threadId": 1, "targetId": 6})  # tick 5: the qkv projection has run
    linear = next(v for v in chip.scope("Node") if v["name"] == "linear")  # the input of the split at tick 5
    location = next(v for v in chip.variables(linear["variablesReference"]) if v["name"] == "location")
    assert location["value"].startswith("32 shards, first: DRAM 0x8")
    shards = next(v for v in chip.variables(location["variablesReference"]) if v["name"] == "shards")
    first = chip.variables(chip.variables(shards["variablesReference"])[0]["variablesReference"])
    fields = {v["name"]: v["value"] for v in first}
    assert fields["unit"].strip("'\"") == "core 0 (gang 0)" and fields["space"].strip("'\"") == "DRAM"
    assert "elements" in fields
