"""Point-to-point sends and recvs between ranks through the wire (docs/ranks.md, "Point-to-point send and recv"): a
real server whose session coordinates real rank processes in one gloo group, on the pipeline-parallel example (4
stages: micro-batches flow rank 0 -> 1 -> 2 -> 3 by isend/irecv, then one all_reduce) and on the planted
point-to-point bugs. One server for the module, relaunched only when a test needs another program, with a ring so
small that values read back are recomputed."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.conftest import EXAMPLES, MODELS, fresh_module, line_of
from tests.dap.wire import Debugger, Server, rank_ticks, refused

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
PIPELINE = EXAMPLES / "pipeline_parallel.py"
P2P = MODELS / "ranks" / "point_to_point.py"
STAGES = 4
SEND, RECV = (line_of(PIPELINE, marker) for marker in ("# SEND", "# RECV"))
LAUNCH = {"stopOnEntry": True, "checkpoint": {"budgetMB": 0.0005}}
TRANSFERS = {"_c10d_functional.isend.default": "sends", "_c10d_functional.irecv.default": "recvs",
             "_c10d_functional.all_reduce.default": "sums"}


def _program(path, ranks: int, **more) -> dict:
    return {"program": str(path), "driver": "torch:cpu", "ranks": ranks, **LAUNCH, **more}


@pytest.fixture(scope="module")
def server(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(PIPELINE, stopOnEntry=True, ranks=STAGES, checkpoint=LAUNCH["checkpoint"])["reason"] \
        == "entry"
    yield Server(debugger, _program(PIPELINE, STAGES))
    debugger.close()


@pytest.fixture
def pipeline(server: Server) -> Debugger:
    return server.launch(_program(PIPELINE, STAGES))


def _frame(debugger: Debugger, thread: int) -> dict:
    return debugger.request("stackTrace", {"threadId": thread})["stackFrames"][0]


def _locals(debugger: Debugger, thread: int) -> dict[str, bytes]:
    """The bytes of every source variable of the thread's rank (readMemory: its storage, bit for bit)."""
    return {v["name"]: base64.b64decode(debugger.request("readMemory", {"memoryReference": v["memoryReference"],
                                                                        "count": 4096})["data"])
            for v in debugger.scope("Locals", frame_id=_frame(debugger, thread)["id"])}


def _floats(raw: bytes) -> list[float]:
    return np.frombuffer(raw, dtype="<f4").tolist()


def _transfers(debugger: Debugger, ranks: int) -> list[dict[str, list[int]]]:
    """Each rank's sends, recvs and all_reduces: the ticks of their nodes (timeline: every node of the rank's
    Program, run or not)."""
    found = []
    for thread in range(1, ranks + 1):
        ticks = debugger.request("timeline", {"start": 0, "count": 100, "threadId": thread})["ticks"]
        kinds = {kind: [] for kind in TRANSFERS.values()}
        for t in ticks:
            if t["op"] in TRANSFERS:
                kinds[TRANSFERS[t["op"]]].append(t["tick"])
        found.append(kinds)
    return found


def _consistent(transfers: list[dict[str, list[int]]], ticks: list[int]) -> None:
    """The pipeline's cut: stage r's recvs come from stage r-1, and a send crosses only with its recv, so each stage
    has passed as many recvs as its previous stage has passed sends (no recv passed before its send, no send
    passed without its recv); every rank has passed the same all_reduces."""
    passed = [{kind: sum(1 for t in at if t < tick) for kind, at in mine.items()}
              for mine, tick in zip(transfers, ticks)]
    assert [p["recvs"] for p in passed[1:]] == [p["sends"] for p in passed[:-1]], (ticks, passed)
    assert len({p["sums"] for p in passed}) == 1, (ticks, passed)


def _walk(debugger: Debugger, stop: dict, motion: str, ranks: int) -> dict[tuple[int, int], dict[str, bytes]]:
    """Every rank stepped (`next` or `stepBack`) until the end (or the beginning), each stop checked to be a
    consistent cut: each rank's source variables at each tick it stood at, by (rank, tick) (the same at every stop
    where it stands there while its peers move)."""
    transfers, seen = _transfers(debugger, ranks), {}
    while True:
        ticks = rank_ticks(stop)
        _consistent(transfers, ticks)
        for rank, tick in enumerate(ticks):
            values = _locals(debugger, rank + 1)
            assert seen.setdefault((rank, tick), values) == values
        if stop["reason"] in ("end", "entry") and len(seen) > ranks:  # the first stop is where the walk starts
            return seen
        stop = debugger.motion(motion, {"threadId": 2})


# -- the pipeline --------------------------------------------------------------------------------------------------
def test_every_stage_is_a_thread_and_the_pipeline_computes_the_one_process_reference(pipeline):
    assert pipeline.request("threads")["threads"] == [{"id": t + 1, "name": f"rank {t}"} for t in range(STAGES)]
    stop = pipeline.motion("continue", {"threadId": 1})
    assert (stop["reason"], stop["allThreadsStopped"]) == ("end", True)
    out, energy = fresh_module(PIPELINE).reference(STAGES)
    values = [_locals(pipeline, t + 1) for t in range(STAGES)]
    assert _floats(values[-1]["out"]) == pytest.approx(out.flatten().tolist(), rel=1e-6, abs=1e-7)
    assert len({v["energy"] for v in values}) == 1  # an all_reduce leaves every stage the same sum, bit for bit
    assert _floats(values[0]["energy"]) == pytest.approx([energy.item()], rel=1e-6)
    shown = {v["name"]: v["type"] for v in pipeline.scope("Locals", frame_id=_frame(pipeline, STAGES)["id"])}
    assert shown["out"] == f"float32[{', '.join(str(n) for n in out.shape)}]"


def test_a_rank_stepped_alone_waits_at_its_send_until_its_peer_reaches_the_recv_and_they_cross_together(pipeline):
    transfers = _transfers(pipeline, STAGES)
    send, recv = transfers[0]["sends"][0], transfers[1]["recvs"][0]
    stop = pipeline.motion("continue", {"threadId": 1, "singleThread": True})  # rank 0 alone, up to its send
    waits = f"rank 0: waits before isend #1 (float32[3,8] to rank 1) at pipeline_parallel.py:{SEND}"
    assert (stop["reason"], stop["threadId"], rank_ticks(stop)) == ("step", 1, [send, 0, 0, 0])
    assert stop["description"].startswith(waits)
    stop = pipeline.motion("next", {"threadId": 1, "singleThread": True})  # its peer has not reached the recv
    assert stop["description"].startswith(waits) and "alone it stays here" in stop["description"]
    assert rank_ticks(stop) == [send, 0, 0, 0]
    stop = pipeline.motion("next", {"threadId": 1})  # every rank steps: rank 0 waits, its peer comes to the recv
    assert rank_ticks(stop)[:2] == [send, recv]
    _consistent(transfers, rank_ticks(stop))
    stop = pipeline.motion("next", {"threadId": 1})  # both wait at the pair: it crosses, the two ranks together
    ticks = rank_ticks(stop)
    assert ticks[0] > send and ticks[1] > recv
    _consistent(transfers, ticks)
    assert _frame(pipeline, 2)["line"] > RECV  # rank 1 on with what rank 0 sent


def test_collectives_lists_each_ranks_sends_recvs_and_all_reduce_with_their_partners_and_what_ran(pipeline):
    pipeline.motion("continue", {"threadId": 3, "singleThread": True})  # rank 2 alone, up to its first recv
    rank2 = pipeline.request("collectives", {"threadId": 3})["ranks"]
    assert [r["rank"] for r in rank2] == [2] and (rank2[0]["passed"], rank2[0]["waits"]) == (0, "before")
    recv, send = rank2[0]["collectives"][:2]
    assert (recv["op"], recv["description"], recv["transfers"], recv["partners"], recv["ran"]) == (
        "irecv", f"irecv #1 (float32[3,8] from rank 1) at pipeline_parallel.py:{RECV}",
        [{"direction": "recv", "peer": 1, "tag": 0, "tensor": "float32[3,8]"}], [{"rank": 1, "number": 2}], False)
    assert (send["op"], send["partners"]) == ("isend", [{"rank": 3, "number": 1}])
    every = pipeline.request("collectives", {})["ranks"]
    assert [r["rank"] for r in every] == [0, 1, 2, 3] and every[0]["waitsReason"]  # rank 0 has not moved
    energy = every[0]["collectives"][-1]
    assert (energy["op"], energy["groupRanks"], [p["rank"] for p in energy["partners"]]) == (
        "all_reduce", [0, 1, 2, 3], [1, 2, 3])
    assert [p["number"] for p in energy["partners"]] == [5, 5, 3]  # each rank's own number for the same one
    pipeline.motion("continue", {"threadId": 1})
    assert all(c["ran"] for r in pipeline.request("collectives", {})["ranks"] for c in r["collectives"])
    refused(pipeline, "collectives", {"threadId": 9}, "no thread 9")


def test_going_back_across_every_send_and_recv_and_forward_again_reads_the_same_bits_on_every_rank(pipeline):
    first = _walk(pipeline, pipeline.motion("restart", {}), "next", STAGES)
    stop = pipeline.motion("continue", {"threadId": 1})
    assert stop["reason"] == "end"
    back = _walk(pipeline, stop, "stepBack", STAGES)  # back across each pair, the ring's values recomputed
    assert set(first) <= set(back)
    assert {k: back[k] for k in first} == first
    assert pipeline.motion("continue", {"threadId": 1})["reason"] == "end"
    again = pipeline.motion("reverseContinue", {"threadId": 3})
    assert again["reason"] == "entry"
    assert _walk(pipeline, again, "next", STAGES) == first  # forward again: the recorded transfers


def test_goto_puts_the_threads_rank_at_its_tick_and_the_others_at_a_cut_where_each_pair_is_crossed_together(
        pipeline):
    transfers = _transfers(pipeline, STAGES)
    end = pipeline.request("timeline", {"count": 0, "threadId": 2})["end"]
    for thread, tick in ((4, transfers[3]["recvs"][-1] + 2), (1, transfers[0]["sends"][0] - 1), (2, end),
                         (3, transfers[2]["recvs"][0] + 2), (4, 0)):  # forward and back across pairs of all ranks
        stop = pipeline.motion("goto", {"threadId": thread, "targetId": tick + 1})
        cut = rank_ticks(stop)[-STAGES:]  # after the words `rank 3 at tick 8`, the cut's own
        assert (stop["reason"], stop["threadId"], cut[thread - 1]) == ("goto", thread, tick)
        _consistent(transfers, cut)


# -- planted bugs ------------------------------------------------------------------------------------------------
def _lines(*markers: str) -> list[str]:
    return [f"point_to_point.py:{line_of(P2P, m)}" for m in markers]


def _deadlock() -> str:
    send, recv = _lines("# BOTH SEND", "# BOTH RECV")
    return (f"rank 0 calls isend #1 (float32[4] to rank 1) at {send}, which rank 1 joins only later, at irecv #2 "
            f"(float32[4] from rank 0) at {recv}; rank 1 calls isend #1 (float32[4] to rank 0) at {send}, which "
            f"rank 0 joins only later, at irecv #2 (float32[4] from rank 1) at {recv}: no rank can go on (a "
            "collective, a send or a recv runs only with its partners)")


def _sizes() -> str:
    send, recv = _lines("# SENDS 8", "# RECEIVES 4")
    return (f"rank 0 calls isend #1 (float32[8] to rank 1) at {send}; rank 1 calls irecv #1 (float32[4] from rank 0) "
            f"at {recv}: rank 0 sends float32[8] and rank 1 receives float32[4]")


def _unmatched() -> str:
    second, total = _lines("# SECOND SEND", "# THEN SUM")
    return (f"rank 0 calls isend #2 (float32[4] to rank 1) at {second}, and rank 1 has no recv to match it; rank 1 "
            f"calls all_reduce #2 (float32[4], sum) at {total}, which rank 0 joins only later, at all_reduce #3 "
            f"(float32[4], sum) at {total}: no rank can go on (a collective, a send or a recv runs only with its "
            "partners)")


@pytest.mark.parametrize("entry, words, lines", [
    ("deadlock", _deadlock(), ("# BOTH SEND", "# BOTH SEND")),
    ("sizes", _sizes(), ("# SENDS 8", "# RECEIVES 4")),
    ("unmatched", _unmatched(), ("# SECOND SEND", "# THEN SUM"))], ids=["deadlock", "sizes", "unmatched"])
def test_a_planted_send_or_recv_bug_stops_every_rank_before_any_blocks_naming_each_side(server, entry, words, lines):
    debugger = server.launch(_program(P2P, 2, entry=entry))
    stop = debugger.motion("continue", {"threadId": 1})
    assert (stop["reason"], stop["text"], stop["description"]) == ("exception", "Hang", words)
    info = debugger.request("exceptionInfo", {"threadId": 1})
    assert (info["exceptionId"], info["description"], info["details"]["message"]) == ("hang", words, words)
    assert info["details"]["source"] == _lines(lines[0])[0]  # where the stop's rank waits
    at = [info["details"]["evidence"]["ticks"][str(r)] for r in (0, 1)]  # where each rank waits
    assert [_frame(debugger, t)["line"] for t in (1, 2)] == [line_of(P2P, m) for m in lines]  # alive, inspectable
    assert [debugger.evaluate("x.tolist()", frame_id=_frame(debugger, t)["id"])["result"] for t in (1, 2)] == \
        ["[0.0, 1.0, 2.0, 3.0]"] * 2
    back = debugger.motion("stepBack", {"threadId": 2})
    assert back["reason"] == "step" and all(b <= a for a, b in zip(at, rank_ticks(back))) and rank_ticks(back) != at
    assert debugger.motion("reverseContinue", {"threadId": 1})["reason"] == "entry"


def test_a_send_to_a_rank_the_session_does_not_have_is_refused_at_launch_and_the_server_goes_on(server):
    server.arguments = None  # the refused relaunch ends the ranks that ran
    send = line_of(P2P, "# SEND")
    refused(server.debugger, "restart", {"arguments": _program(P2P, 1)},
            f"isend #1 (float32[4] to rank 1) at point_to_point.py:{send} sends to rank 1, and this session has "
            "ranks 0..0")
    assert server.debugger.request("threads")["threads"] == []
    assert server.launch(_program(P2P, 2)).request("threads")["threads"] == [{"id": 1, "name": "rank 0"},
                                                                            {"id": 2, "name": "rank 1"}]


# -- a NaN carried by a send ---------------------------------------------------------------------------------------
def test_a_nan_carried_by_a_send_names_the_rank_and_line_it_was_born_on(server):
    debugger = server.launch(_program(P2P, 2, entry="nan"))
    debugger.request("setExceptionBreakpoints", {"filters": ["nan"]})
    born, carries = _lines("# BORN", "# CARRIES")
    birth = debugger.motion("continue", {"threadId": 1})  # rank 0 makes the NaN, before its send
    will = f"NaN born on rank 0 at {born}; isend at {carries} will carry it to rank 1"
    assert (birth["reason"], birth["text"], birth["threadId"]) == ("exception", "NaN", 1)
    assert birth["description"].startswith(f"rank 0: {will} (")
    assert debugger.request("exceptionInfo", {"threadId": 1})["description"].endswith(will.removeprefix("NaN "))
    refused(debugger, "exceptionInfo", {"threadId": 2}, "rank 1: not stopped on an exception")  # rank 0's NaN
    stop = debugger.motion("continue", {"threadId": 1})  # the send carries it: rank 1's recv writes it
    carried = f"NaN born on rank 0 at {born}; isend at {carries} carried it to rank 1"
    assert (stop["reason"], stop["text"], stop["threadId"]) == ("exception", "NaN", 2)
    assert stop["description"].startswith(f"rank 1: {carried} (")
    info = debugger.request("exceptionInfo", {"threadId": 2})
    evidence = info["details"]["evidence"]
    assert (info["exceptionId"], evidence["message"]) == ("nan", carried.removeprefix("NaN "))
    assert [(b["rank"], b["source"]) for b in evidence["born"]] == [(0, born)]
    assert (evidence["carriedBy"]["collective"], evidence["carriedBy"]["source"], evidence["carriedBy"]["rank"],
            evidence["carriedTo"]) == ("isend", carries, 0, [1])
    assert _frame(debugger, 2)["line"] == line_of(P2P, "# ARRIVES")


# -- traces --------------------------------------------------------------------------------------------------------
def test_a_pipeline_recorded_through_the_wire_steps_back_across_its_sends_post_mortem_to_the_recorded_values(
        server, tmp_path):
    index = tmp_path / "run.rwtrace"
    live = server.launch(_program(PIPELINE, 2, record=str(index)))
    recorded = _walk(live, live.motion("restart", {}), "next", 2)  # run to the end: the traces hold every tick
    traced = server.launch({"trace": str(index), **LAUNCH})  # the live ranks end, their traces and index written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rank0.rwtrace", "run.rank1.rwtrace", "run.rwtrace"]
    assert traced.request("threads")["threads"] == [{"id": 1, "name": "rank 0"}, {"id": 2, "name": "rank 1"}]
    stop = traced.motion("continue", {"threadId": 1})
    assert stop["reason"] == "end"
    back = _walk(traced, stop, "stepBack", 2)
    assert set(recorded) <= set(back)
    assert {k: back[k] for k in recorded} == recorded
