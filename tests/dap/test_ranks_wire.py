"""Many ranks through the wire (docs/protocol.md, "Many ranks"): a real server whose session coordinates 2 real rank
processes in one gloo process group, on the planted skipped collective (rank 1 leaves out an all_reduce rank 0
runs). One launch for the module, with a ring so small that values read back are recomputed."""

from __future__ import annotations

import base64
import math
import re
import socket
import struct

import pytest

from dap_server.client import DapError
from dap_server.frames import FRAMES_PER_THREAD
from tests.conftest import MODELS, line_of
from tests.dap.wire import Debugger, rank_ticks, refused, rewind

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
MODEL = MODELS / "ranks" / "skipped_collective.py"
REDUCE, SKIPPED, GATHER = (line_of(MODEL, marker) for marker in ("# REDUCE", "# SKIPPED", "# GATHER"))
MISMATCH = (f"rank 0 calls all_reduce #2 (float32[4], sum) at skipped_collective.py:{SKIPPED}; rank 1 calls "
            f"all_gather_into_tensor #2 (float32[4]) at skipped_collective.py:{GATHER}")


LAUNCH = {"stopOnEntry": True, "ranks": 2, "checkpoint": {"budgetMB": 0.0005}}


@pytest.fixture(scope="module")
def ranks(schema):
    debugger = Debugger.spawn(schema)
    stop = debugger.start(MODEL, **LAUNCH)
    assert stop["reason"] == "entry" and stop["allThreadsStopped"]
    yield debugger
    debugger.close()


@pytest.fixture
def entry(ranks: Debugger) -> Debugger:
    ranks.set_breakpoints(MODEL, [])
    for kind in ("setFunctionBreakpoints", "setDataBreakpoints"):
        ranks.request(kind, {"breakpoints": []})
    assert ranks.motion("restart", {})["reason"] == "entry"
    return ranks


@pytest.fixture
def edits(entry: Debugger):
    """For a test that edits values: an edit is a step of its rank's run for good, so the ranks are launched anew
    after it (the module's one relaunch)."""
    yield entry
    relaunch = {"program": str(MODEL), "driver": "torch:cpu", **LAUNCH}
    assert entry.motion("restart", {"arguments": relaunch})["reason"] == "entry"


def _frame(debugger: Debugger, thread: int) -> dict:
    return debugger.request("stackTrace", {"threadId": thread})["stackFrames"][0]


def _values(debugger: Debugger, expression: str) -> list[str]:
    """`expression` evaluated on each rank's top frame."""
    return [debugger.evaluate(expression, frame_id=_frame(debugger, t)["id"])["result"] for t in (1, 2)]


def test_every_rank_is_a_thread_with_a_stack_of_its_own(entry):
    assert entry.request("threads")["threads"] == [{"id": 1, "name": "rank 0"}, {"id": 2, "name": "rank 1"}]
    frames = {t: entry.request("stackTrace", {"threadId": t})["stackFrames"] for t in (1, 2)}
    assert all(f["line"] == REDUCE and f["source"]["path"] == str(MODEL) for f in (frames[1][0], frames[2][0]))
    assert [f["id"] for f in frames[2]] == [f["id"] + FRAMES_PER_THREAD for f in frames[1]]


def test_a_step_moves_every_rank_and_names_the_rank_that_stepped(entry):
    stop = entry.motion("next", {"threadId": 2})  # every rank runs up to the all_reduce and waits there
    assert (stop["reason"], stop["threadId"], stop["allThreadsStopped"]) == ("step", 2, True)
    assert stop["description"].startswith(f"rank 1: waits before all_reduce #1 (float32[4], sum) at "
                                          f"skipped_collective.py:{REDUCE}")
    tick = entry.request("timeline", {"count": 0})["position"]
    assert f"rank 0 at tick {tick}, rank 1 at tick {tick}" in stop["description"]  # a consistent cut
    stop = entry.motion("next", {"threadId": 1})  # all of them run it together
    assert stop["threadId"] == 1 and [_frame(entry, t)["line"] for t in (1, 2)] == [SKIPPED, GATHER]
    assert entry.motion("restart", {})["reason"] == "entry"
    assert entry.motion("stepIn", {"threadId": 2})["description"].startswith("rank 1: waits before all_reduce #1")
    stop = entry.motion("stepOut", {"threadId": 2})  # out of forward: each rank runs up to its next collective
    assert (stop["reason"], stop["threadId"]) == ("step", 2)
    assert [_frame(entry, t)["line"] for t in (1, 2)] == [SKIPPED, GATHER]


def test_scopes_variables_and_evaluate_answer_for_the_frames_rank(entry):
    entry.motion("next", {"threadId": 1})  # both wait before the all_reduce, each with its own sin(x * (rank + 1))
    for thread in (1, 2):
        node = entry.scope("Node", frame_id=_frame(entry, thread)["id"])
        sent = next(v for v in node if v["type"].startswith("input"))
        elements = entry.variables(sent["variablesReference"], filter="indexed", start=0, count=4)
        assert [float(e["value"]) for e in elements] == pytest.approx([math.sin(i * thread) for i in range(4)],
                                                                       abs=1e-5)
    assert _values(entry, "x.tolist()") == ["[0.0, 1.0, 2.0, 3.0]"] * 2


def test_a_skipped_collective_stops_every_rank_before_either_blocks(entry):
    stop = entry.motion("continue", {"threadId": 1})
    assert (stop["reason"], stop["text"], stop["description"]) == ("exception", "Hang", MISMATCH)
    info = entry.request("exceptionInfo", {"threadId": 1})
    assert (info["exceptionId"], info["description"], info["details"]["message"]) == ("hang", MISMATCH, MISMATCH)
    assert info["details"]["source"] == f"skipped_collective.py:{SKIPPED}"
    assert [_frame(entry, t)["line"] for t in (1, 2)] == [SKIPPED, GATHER]  # alive and inspectable
    back = entry.motion("stepBack", {"threadId": 2})  # rank 0 to the start of its line, rank 1 to right after
    assert back["reason"] == "step" and [_frame(entry, t)["line"] for t in (1, 2)] == [SKIPPED, REDUCE]  # the reduce


def test_going_back_across_a_collective_and_forward_again_reads_the_same_bits_on_every_rank(entry):
    entry.motion("continue", {"threadId": 1})  # past the all_reduce, at the mismatch
    summed = _values(entry, "h.tolist()")
    assert summed[0] == summed[1]  # an all_reduce leaves every rank the same sum
    assert entry.motion("reverseContinue", {"threadId": 2})["reason"] == "entry"
    assert entry.motion("continue", {"threadId": 1})["reason"] == "exception"  # the recorded all_reduce, not a new
    assert _values(entry, "h.tolist()") == summed


def test_a_breakpoint_binds_on_every_rank_and_its_stop_names_the_rank_that_hit_it(entry):
    bp, = entry.set_breakpoints(MODEL, [{"line": GATHER}])
    assert bp["verified"] and bp["line"] == GATHER
    stop = entry.motion("continue", {"threadId": 1})  # rank 0 waits at its all_reduce, rank 1 reaches the line
    assert (stop["reason"], stop["threadId"], stop["hitBreakpointIds"]) == ("breakpoint", 2, [bp["id"]])
    assert stop["description"].startswith("rank 1: ")


def test_goto_puts_the_threads_rank_at_the_target_and_the_other_at_a_consistent_cut(entry):
    targets = entry.request("gotoTargets", {"source": {"path": str(MODEL)}, "line": SKIPPED})["targets"]  # rank 0's
    stop = entry.motion("goto", {"threadId": 1, "targetId": targets[0]["id"]})
    assert (stop["reason"], stop["threadId"]) == ("goto", 1)
    assert [_frame(entry, t)["line"] for t in (1, 2)] == [SKIPPED, REDUCE]  # rank 1 right after the all_reduce
    refused(entry, "goto", {"threadId": 2, "targetId": 10_000}, "is not a tick of rank 1's program")


def test_what_ranks_cannot_do_yet_is_refused_in_words_and_the_session_goes_on(entry):
    refused(entry, "ablatePrecision", {"search": True}, "'ablatePrecision' is not supported with ranks yet")
    refused(entry, "addPatch", {"name": "p", "node": "sin", "precision": "float64"},
             "'addPatch' is not supported with ranks: a patched pass runs its nodes again on one rank")
    refused(entry, "stepIn", {"threadId": 1, "targetId": 10_000}, "target 10000 is not a node still to run on "
                                                                  "rank 0's line")
    refused(entry, "restart", {"arguments": {"program": str(MODEL), "ranks": 2, "faults": [{}]}},
             "sim chip faults with ranks is not supported yet")
    assert _frame(entry, 2)["line"] == REDUCE  # the ranks are still there


@pytest.mark.parametrize("arguments, words", [
    ({"threadId": 3}, "no thread 3"), ({"threadId": 0}, "no thread 0")])
def test_a_thread_that_is_no_rank_is_refused(ranks, arguments, words):
    refused(ranks, "stackTrace", arguments, words)


def test_a_frame_or_reference_of_no_rank_is_refused(ranks):
    refused(ranks, "scopes", {"frameId": 2 * FRAMES_PER_THREAD + 1}, f"no frame {2 * FRAMES_PER_THREAD + 1}")
    refused(ranks, "scopes", {"frameId": 0}, "no frame 0")
    deeper = FRAMES_PER_THREAD + 50  # rank 1's frame #50: its stack is not that deep
    for words in (f"rank 1: no frame {deeper}: the stack has ", f" frame(s) (ids {FRAMES_PER_THREAD + 1}.."):
        refused(ranks, "evaluate", {"expression": "1", "frameId": deeper}, words)  # the session's ids, not the rank's
    refused(ranks, "variables", {"variablesReference": 99_999}, "variablesReference 99999 is unknown")


@pytest.mark.parametrize("arguments", [{"ranks": 0}, {"ranks": 65}, {"ranks": "2"}, {"ranks": True},
                                       {"ranks": 2, "rankTimeout": 0}, {"ranks": 2, "rankTimeout": "60"}])
def test_a_number_of_ranks_or_a_timeout_that_is_none_is_refused(ranks, arguments):
    refused(ranks, "launch", {"program": str(MODEL), **arguments}, f"field '{list(arguments)[-1]}'")


def test_the_console_gives_its_ranks_to_the_launch():
    done = rewind("debug", str(MODEL), "--ranks", "0", "-x", "/dev/null")
    assert done.returncode == 1 and "launch: field 'ranks': input should be greater than or equal to 1" in done.stderr


@pytest.mark.parametrize("arguments, words", [
    ({"ranks": 2, "rendezvous": "nonsense"}, "rendezvous 'nonsense' is not host:port"),
    ({"ranks": 2, "rendezvous": "127.0.0.1:99999"}, "is not host:port"),
    ({"ranks": 2, "rendezvous": 29500}, "field 'rendezvous': input should be a valid string"),
    ({"rendezvous": "127.0.0.1:0"}, "'rendezvous' is where ranks meet: give 'ranks' too"),
    ({"ranks": 2, "join": "nowhere"}, "join 'nowhere' is not host:port"),
    ({"ranks": 2, "join": ["127.0.0.1:1"]}, "field 'join': input should be a valid string"),
    ({"join": "127.0.0.1:0"}, "'join' is where ranks started by torchrun join a running program: give 'ranks'")])
def test_a_rendezvous_or_join_that_is_no_host_and_port_or_has_no_ranks_is_refused(ranks, arguments, words):
    refused(ranks, "launch", {"program": str(MODEL), **arguments}, words)


def test_the_consoles_rendezvous_is_where_the_coordinator_serves_the_ranks():
    with socket.socket() as taken:  # the port is in use: the coordinator's attempt to serve there says so
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = rewind("debug", str(MODEL), "--ranks", "2", "--rdzv", f"127.0.0.1:{port}", "-x", "/dev/null")
    assert done.returncode == 1
    assert f"cannot serve the ranks' rendezvous at 127.0.0.1:{port}" in done.stderr and "address already in use" \
        in done.stderr


# -- values, memory and ticks per rank ----------------------------------------------------------------------------
def _node_input(debugger: Debugger, thread: int) -> dict:
    """The value the top frame's node reads on the thread's rank (before the all_reduce: sin(x * rank + 1))."""
    node = debugger.scope("Node", frame_id=_frame(debugger, thread)["id"])
    return next(v for v in node if v["type"].startswith("input"))


def _floats(data: str) -> list[float]:
    raw = base64.b64decode(data)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def test_a_values_memory_reference_and_location_name_its_rank_and_read_that_ranks_bytes(entry):
    entry.motion("next", {"threadId": 1})  # both wait before the all_reduce, each with its own sin(x * (rank + 1))
    for thread, rank in ((1, 0), (2, 1)):
        sent = _node_input(entry, thread)
        assert sent["memoryReference"] == f"rank{rank}:rewind-value:sin"
        read = entry.request("readMemory", {"memoryReference": sent["memoryReference"], "count": 16})
        assert _floats(read["data"]) == pytest.approx([math.sin(i * thread) for i in range(4)], abs=1e-6)
        place = entry.request("locate", {"name": "sin", "frameId": _frame(entry, thread)["id"]})
        shard, = place["shards"]
        assert (place["rank"], shard["rank"], shard["chip"], hex(shard["address"])) == (rank, rank, "cpu",
                                                                                         read["address"])
        location = next(v for v in entry.variables(sent["variablesReference"]) if v["name"] == "location")
        assert {"name": "rank", "value": str(rank), "variablesReference": 0} in entry.variables(
            location["variablesReference"])


def test_provenance_and_histogram_answer_for_the_frames_rank(entry):
    entry.motion("next", {"threadId": 1})
    found = {}
    for thread in (1, 2):
        frame = _frame(entry, thread)["id"]
        provenance = entry.request("provenance", {"name": "sin", "frameId": frame, "maxHistory": 1})
        histogram = entry.request("histogram", {"expression": "sin", "frameId": frame, "bins": 2})
        assert provenance["rank"] == histogram["rank"] == thread - 1
        assert provenance["lastWriter"]["node"] == "sin" and provenance["lastWriter"]["source"]["line"] == REDUCE
        found[thread] = (provenance["lastWriter"]["digest"], histogram["bins"]["edges"][-1])
    assert found[1][0] != found[2][0]  # the same node wrote other values on each rank
    assert found[1][1] == pytest.approx(max(math.sin(i) for i in range(4)))
    assert found[2][1] == pytest.approx(max(math.sin(2 * i) for i in range(4)))


def test_a_tick_is_its_ranks_named_by_thread_or_the_last_stop(entry):
    stop = entry.motion("next", {"threadId": 2})  # about rank 1: requests with no thread ask rank 1
    tick = rank_ticks(stop)[1]
    holds = {t: entry.request("findTick", {"expression": "sin.sum() > 0", "start": 0, "maxTicks": tick + 1,
                                           "threadId": t}) for t in (1, 2)}
    assert holds[1]["tick"] == tick and holds[2]["tick"] is None and "holds at no tick" in holds[2]["tickReason"]
    address = hex(entry.request("locate", {"name": "sin"})["shards"][0]["address"])
    at = entry.request("valueAt", {"address": address})
    assert (at["rank"], at["value"]) == (1, "sin")
    diff = entry.request("valueDiff", {"expression": "sin", "ticks": [tick, tick], "threadId": 2})
    assert (diff["rank"], diff["differing"]) == (1, 0)
    refused(entry, "units", {"threadId": 2}, "rank 1: driver torch:cpu runs nodes, not instruction streams")
    assert entry.request("checkpoints", {"threadId": 1})["rank"] == 0
    for command, arguments in (("findTick", {"expression": "sin.sum() > 0", "threadId": 2}),
                               ("writeHistory", {"name": "h"}), ("timelineEvents", {"threadId": 2})):
        with pytest.raises(DapError) as caught:  # the ranks never run past the mismatch: nor does a request
            entry.request(command, arguments)
        assert re.search(f"^rank 1: '{command}' reads this rank's run past tick \\d+, where it has not run yet: "
                         ".* runs only with every rank. Run every rank on first", caught.value.message)
    assert rank_ticks(entry.motion("next", {"threadId": 1}))[1] > tick  # where it was: the all_reduce runs with both


def test_step_in_targets_are_the_frames_ranks_and_a_target_past_a_collective_takes_every_rank(entry):
    targets = entry.request("stepInTargets", {"frameId": _frame(entry, 2)["id"]})["targets"]
    assert [t["label"].split(": ")[1].split(" ")[0] for t in targets] == ["sin", "all_reduce", "wait_tensor"]
    stop = entry.motion("stepIn", {"threadId": 2, "targetId": targets[0]["id"], "singleThread": True})
    assert (stop["reason"], stop["threadId"], rank_ticks(stop)) == ("step", 2, [0, targets[0]["id"] - 1])  # rank 0 stays
    refused(entry, "stepIn", {"threadId": 2, "targetId": targets[2]["id"], "singleThread": True},
             f"rank 1 alone cannot reach target {targets[2]['id']}: it would cross all_reduce #1")
    stop = entry.motion("stepIn", {"threadId": 2, "targetId": targets[2]["id"]})
    assert (stop["reason"], stop["threadId"], rank_ticks(stop)[1]) == ("step", 2, targets[2]["id"] - 1)
    assert _frame(entry, 1)["line"] == REDUCE  # rank 0 ran the all_reduce with it, and waits right after


def test_breakpoint_locations_are_every_ranks_lines(entry):
    lines = entry.request("breakpointLocations", {"source": {"path": str(MODEL)}, "line": REDUCE,
                                                  "endLine": GATHER})["breakpoints"]
    assert lines == [{"line": REDUCE}, {"line": SKIPPED}, {"line": GATHER}]  # SKIPPED runs on rank 0 only


# -- breakpoints on every rank, or on one --------------------------------------------------------------------------
def test_a_function_breakpoint_binds_on_every_rank_and_stops_on_each_ranks_thread(entry):
    sin, skipped, nope = entry.request("setFunctionBreakpoints", {"breakpoints": [
        {"name": "sin"}, {"name": "mul_1"}, {"name": "nope"}]})["breakpoints"]
    assert (sin["verified"], skipped["verified"], nope["verified"]) == (True, True, False)  # mul_1: rank 0's only
    assert len({sin["id"], skipped["id"], nope["id"]}) == 3
    stop = entry.motion("continue", {"threadId": 2, "singleThread": True})
    assert (stop["reason"], stop["threadId"], stop["hitBreakpointIds"]) == ("function breakpoint", 2, [sin["id"]])
    stop = entry.motion("continue", {"threadId": 1})  # rank 0 reaches it too; rank 1 goes on to its all_reduce
    assert (stop["reason"], stop["threadId"], stop["hitBreakpointIds"]) == ("function breakpoint", 1, [sin["id"]])
    stop = entry.motion("continue", {"threadId": 1})
    assert (stop["threadId"], stop["hitBreakpointIds"], _frame(entry, 1)["line"]) == (1, [skipped["id"]], SKIPPED)


def test_a_data_breakpoint_is_set_on_the_rank_its_data_id_names(entry):
    scope = next(s for s in entry.request("scopes", {"frameId": _frame(entry, 2)["id"]})["scopes"]
                 if s["name"].startswith("Node"))
    info = entry.request("dataBreakpointInfo", {"name": "mul", "variablesReference": scope["variablesReference"]})
    assert info["dataId"] == "rank1:mul" and info["description"].startswith("rank 1: write to 'mul'")
    mul, *bad = entry.request("setDataBreakpoints", {"breakpoints": [
        {"dataId": "rank1:mul"}, {"dataId": "mul"}, {"dataId": "rank7:mul"}, {"dataId": "rank1:mul_1"}]})["breakpoints"]
    assert mul["verified"] and not any(b["verified"] for b in bad)
    assert "names no rank" in bad[0]["message"] and "names rank 7: this session has ranks 0..1" in bad[1]["message"]
    assert "mul_1" in bad[2]["message"]  # rank 0's value: rank 1 has none of that name
    stop = entry.motion("continue", {"threadId": 1})  # rank 0 runs to its all_reduce; rank 1 stops after the write
    assert (stop["reason"], stop["threadId"], stop["hitBreakpointIds"]) == ("data breakpoint", 2, [mul["id"]])


def test_instruction_breakpoints_and_disassembly_go_to_the_rank_their_reference_names(entry):
    torch = "driver torch:cpu runs nodes, not instruction streams"  # the ranks' chip has no instructions: it says so
    refused(entry, "setInstructionBreakpoints", {"breakpoints": [{"instructionReference": "rank1:0x10"}]},
             f"rank 1: {torch}")
    refused(entry, "disassemble", {"memoryReference": "rank1:0x10", "instructionCount": 1}, f"rank 1: {torch}")
    refused(entry, "disassemble", {"memoryReference": "rank2:0x10", "instructionCount": 1}, "names rank 2")


def test_a_request_naming_no_rank_or_two_ranks_is_refused(entry):
    refused(entry, "writeHistory", {"name": "x", "threadId": 3}, "no thread 3")
    refused(entry, "valueAt", {"address": 0, "threadId": 0}, "no thread 0")
    rank_1s = entry.request("scopes", {"frameId": _frame(entry, 2)["id"]})["scopes"][0]["variablesReference"]
    refused(entry, "dataBreakpointInfo", {"name": "x", "variablesReference": rank_1s, "frameId": 1},
             "the request names ranks 0 and 1 (by its references, frame or thread): name one")


@pytest.mark.parametrize("reference, words", [
    ("rank9:rewind-value:sin", "memoryReference 'rank9:rewind-value:sin' names rank 9: this session has ranks 0..1"),
    ("rewind-value:sin", "memoryReference 'rewind-value:sin' names no rank"),
    ("rank1:bogus", "rank 1: memoryReference 'bogus' does not name a value of the program")])
def test_a_memory_reference_of_no_rank_is_refused(ranks, reference, words):
    refused(ranks, "readMemory", {"memoryReference": reference, "count": 4}, words)


# -- edits ---------------------------------------------------------------------------------------------------------
def test_an_edit_where_a_rank_has_no_recorded_future_is_made_and_one_in_its_past_is_refused(edits):
    assert edits.motion("continue", {"threadId": 1})["reason"] == "exception"  # each rank at its frontier
    x = {t: next(v for v in edits.scope("Locals", frame_id=_frame(edits, t)["id"]) if v["name"] == "x")
         for t in (1, 2)}
    mark = edits.client.mark()
    assert edits.request("setVariable", {"variablesReference": x[2]["variablesReference"], "name": "[0]",
                                         "value": "7"})["value"] == "7"
    written = edits.request("writeMemory", {"memoryReference": x[1]["memoryReference"], "offset": 4,
                                            "data": base64.b64encode(struct.pack("<f", 9.0)).decode()})
    assert written["bytesWritten"] == 4
    assert edits.client.wait_for("memory", after=mark)["memoryReference"] == "rank0:rewind-value:x"
    assert _values(edits, "x.tolist()") == ["[0.0, 9.0, 2.0, 3.0]", "[7.0, 1.0, 2.0, 3.0]"]  # each rank its own
    assert edits.motion("reverseContinue", {"threadId": 1})["reason"] == "entry"  # the edits are steps of their own
    assert edits.motion("continue", {"threadId": 1})["description"] == MISMATCH
    assert [_frame(edits, t)["line"] for t in (1, 2)] == [SKIPPED, GATHER]
    edits.motion("restart", {})
    tick = rank_ticks(edits.motion("next", {"threadId": 2}))[1]  # before the all_reduce, which they ran together
    sent = _node_input(edits, 2)
    past = (f"rank 1: at tick {tick} of a recorded run that goes on to tick ", f", before all_reduce #1 (float32[4], "
            f"sum) at skipped_collective.py:{REDUCE}, which it ran with its peers: an edit here would change what it "
            "sent them")
    for command, arguments in (("setVariable", {"variablesReference": sent["variablesReference"], "name": "[0]",
                                                "value": "1"}),
                               ("writeMemory", {"memoryReference": sent["memoryReference"],
                                                "data": base64.b64encode(struct.pack("<f", 1.0)).decode()})):
        with pytest.raises(DapError) as caught:
            edits.request(command, arguments)
        assert all(words in caught.value.message for words in past)
    assert _floats(edits.request("readMemory", {"memoryReference": sent["memoryReference"], "count": 4})["data"]) \
        == [0.0]  # nothing written
