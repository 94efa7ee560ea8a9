"""Many ranks through the wire (docs/protocol.md, "Many ranks"): a real server whose session coordinates 2 real rank
processes in one gloo process group, on the planted skipped collective (rank 1 leaves out an all_reduce rank 0
runs). One launch for the module, with a ring so small that values read back are recomputed."""

from __future__ import annotations

import math
import socket

import pytest

from dap_server.client import DapError
from dap_server.frames import FRAMES_PER_THREAD
from tests.conftest import MODELS, line_of
from tests.dap.wire import Debugger, rewind

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
MODEL = MODELS / "ranks" / "skipped_collective.py"
REDUCE, SKIPPED, GATHER = (line_of(MODEL, marker) for marker in ("# REDUCE", "# SKIPPED", "# GATHER"))
MISMATCH = (f"rank 0 calls all_reduce #2 (float32[4], sum) at skipped_collective.py:{SKIPPED}; rank 1 calls "
            f"all_gather_into_tensor #2 (float32[4]) at skipped_collective.py:{GATHER}")


@pytest.fixture(scope="module")
def ranks(schema):
    debugger = Debugger.spawn(schema)
    stop = debugger.start(MODEL, stopOnEntry=True, ranks=2, checkpoint={"budgetMB": 0.0005})
    assert stop["reason"] == "entry" and stop["allThreadsStopped"]
    yield debugger
    debugger.close()


@pytest.fixture
def entry(ranks: Debugger) -> Debugger:
    ranks.set_breakpoints(MODEL, [])
    assert ranks.motion("restart", {})["reason"] == "entry"
    return ranks


def _frame(debugger: Debugger, thread: int) -> dict:
    return debugger.request("stackTrace", {"threadId": thread})["stackFrames"][0]


def _values(debugger: Debugger, expression: str) -> list[str]:
    """`expression` evaluated on each rank's top frame."""
    return [debugger.evaluate(expression, frame_id=_frame(debugger, t)["id"])["result"] for t in (1, 2)]


def _refused(debugger: Debugger, command: str, arguments: dict, words: str) -> None:
    with pytest.raises(DapError) as caught:
        debugger.request(command, arguments)
    assert words in caught.value.message
    assert "Error" not in caught.value.message  # words, not a Python exception's name


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
    _refused(entry, "goto", {"threadId": 2, "targetId": 10_000}, "is not a tick of rank 1's program")


def test_what_ranks_cannot_do_yet_is_refused_in_words_and_the_session_goes_on(entry):
    _refused(entry, "setFunctionBreakpoints", {"breakpoints": [{"name": "sin"}]},
             "'setFunctionBreakpoints' is not supported with ranks yet")
    _refused(entry, "readMemory", {"memoryReference": "x", "count": 4}, "'readMemory' is not supported with ranks")
    _refused(entry, "stepIn", {"threadId": 1, "targetId": 2}, "stepIn targets are not supported with ranks yet")
    _refused(entry, "restart", {"arguments": {"program": str(MODEL), "ranks": 2, "faults": [{}]}},
             "sim chip faults with ranks is not supported yet")
    assert _frame(entry, 2)["line"] == REDUCE  # the ranks are still there


@pytest.mark.parametrize("arguments, words", [
    ({"threadId": 3}, "no thread 3"), ({"threadId": 0}, "no thread 0")])
def test_a_thread_that_is_no_rank_is_refused(ranks, arguments, words):
    _refused(ranks, "stackTrace", arguments, words)


def test_a_frame_or_reference_of_no_rank_is_refused(ranks):
    _refused(ranks, "scopes", {"frameId": 2 * FRAMES_PER_THREAD + 1}, f"no frame {2 * FRAMES_PER_THREAD + 1}")
    _refused(ranks, "scopes", {"frameId": 0}, "no frame 0")
    _refused(ranks, "variables", {"variablesReference": 99_999}, "variablesReference 99999 is unknown")


@pytest.mark.parametrize("arguments", [{"ranks": 0}, {"ranks": 65}, {"ranks": "2"}, {"ranks": True},
                                       {"ranks": 2, "rankTimeout": 0}, {"ranks": 2, "rankTimeout": "60"}])
def test_a_number_of_ranks_or_a_timeout_that_is_none_is_refused(ranks, arguments):
    _refused(ranks, "launch", {"program": str(MODEL), **arguments}, f"field '{list(arguments)[-1]}'")


def test_the_console_gives_its_ranks_to_the_launch():
    done = rewind("debug", str(MODEL), "--ranks", "0", "-x", "/dev/null")
    assert done.returncode == 1 and "launch: field 'ranks': input should be greater than or equal to 1" in done.stderr


@pytest.mark.parametrize("arguments, words", [
    ({"ranks": 2, "rendezvous": "nonsense"}, "rendezvous 'nonsense' is not host:port"),
    ({"ranks": 2, "rendezvous": "127.0.0.1:99999"}, "is not host:port"),
    ({"ranks": 2, "rendezvous": 29500}, "field 'rendezvous': input should be a valid string"),
    ({"rendezvous": "127.0.0.1:0"}, "'rendezvous' is where ranks meet: give 'ranks' too")])
def test_a_rendezvous_that_is_no_host_and_port_or_has_no_ranks_is_refused(ranks, arguments, words):
    _refused(ranks, "launch", {"program": str(MODEL), **arguments}, words)


def test_the_consoles_rendezvous_is_where_the_coordinator_serves_the_ranks():
    with socket.socket() as taken:  # the port is in use: the coordinator's attempt to serve there says so
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = rewind("debug", str(MODEL), "--ranks", "2", "--rdzv", f"127.0.0.1:{port}", "-x", "/dev/null")
    assert done.returncode == 1
    assert f"cannot serve the ranks' rendezvous at 127.0.0.1:{port}" in done.stderr and "address already in use" \
        in done.stderr
