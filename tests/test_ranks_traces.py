"""Traces of many ranks (hardware/ranks/traces.py; docs/ranks.md, "Traces of many ranks") through the wire: one real
server records the tensor-parallel example on 2 ranks of a gloo group (a trace per rank and their index), then
opens the index post-mortem (no device, no process group), then is handed damaged and crafted indexes."""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import zlib
from pathlib import Path

import msgpack
import pytest

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from hardware.ranks.traces import check_rank_trace, file_digest, index_ranks, read_index
from tests.conftest import EXAMPLES
from tests.dap.wire import Debugger, SchemaCheck, rank_ticks, refused

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
TENSOR_PARALLEL = EXAMPLES / "tensor_parallel.py"
HEADER, BODY = struct.Struct("<8sII"), struct.Struct("<II")  # the index's layout, as docs/ranks.md gives it
SCHEMA = SchemaCheck()


@pytest.fixture(autouse=True)
def every_message_follows_the_schema():
    before = len(SCHEMA.failures)
    yield
    assert SCHEMA.failures[before:] == [], "messages that break the DAP schema"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ranks-traces")


@pytest.fixture(scope="module")
def server():
    debugger = Debugger.spawn(SCHEMA)
    yield debugger
    debugger.close()


@pytest.fixture(scope="module")
def live(server, folder) -> dict:
    """The example run live on 2 ranks, recorded to run.rwtrace, node by node: every rank's values at every cut."""
    stop = server.start(TENSOR_PARALLEL, stopOnEntry=True, ranks=2, record=str(folder / "run.rwtrace"),
                        checkpoint={"budgetMB": 0.0005})
    return _walk(server, stop, "next")


@pytest.fixture(scope="module")
def traced(server, folder, live) -> Debugger:
    """The index opened in the same server: the live ranks end first (their traces finished, the index written)."""
    stop = server.motion("restart", {"arguments": {"trace": str(folder / "run.rwtrace"), "stopOnEntry": True,
                                                   "checkpoint": {"budgetMB": 0.0005}}})
    assert stop["reason"] == "entry"
    return server


def _values(debugger: Debugger, thread: int) -> dict[str, str]:
    """Every live value of the thread's rank (`$name`: the Program value), each element exactly (a float's repr
    round-trips)."""
    frame = debugger.request("stackTrace", {"threadId": thread})["stackFrames"][0]["id"]
    return {v["name"]: debugger.evaluate(f"${v['name']}.tolist()", frame_id=frame)["result"]
            for v in debugger.scope("Live values", frame_id=frame)}


def _walk(debugger: Debugger, stop: dict, motion: str) -> dict[tuple[int, ...], dict[int, dict[str, str]]]:
    """One node at a time (`next` or `stepBack`) until the end (or the beginning): each cut's values by rank."""
    seen = {}
    while True:
        seen[tuple(rank_ticks(stop))] = {rank: _values(debugger, rank + 1) for rank in (0, 1)}
        if stop["reason"] in ("end", "entry") and len(seen) > 1:
            return seen
        stop = debugger.motion(motion, {"threadId": 2, "granularity": "instruction"})


def test_recording_ranks_writes_a_trace_per_rank_beside_their_index(traced, folder, live):
    assert sorted(p.name for p in folder.iterdir()) == ["run.rank0.rwtrace", "run.rank1.rwtrace", "run.rwtrace"]
    index = read_index(str(folder / "run.rwtrace"))
    assert (index.world_size, index.program, index.entry) == (2, str(TENSOR_PARALLEL), "build")
    for rank in index.ranks:
        assert rank.path == folder / f"run.rank{rank.rank}.rwtrace" and rank.size == rank.path.stat().st_size
        assert [(c.number, c.op, c.tensors) for c in rank.collectives] == [(1, "all_reduce", ("float32[4,8]",)),
                                                                           (2, "all_reduce", ("float32[4,8]",))]
    assert len(live) == 13 and all(len(set(ticks)) == 1 for ticks in live)  # ticks 0..12, in consistent cuts
    before, after = live[(3, 3)], live[(4, 4)]  # around all_reduce #1: each rank's partial sum, then their sum
    assert before[0]["linear_1"] != before[1]["linear_1"] and after[0]["all_reduce"] == after[1]["all_reduce"]


def test_the_index_opens_every_rank_as_a_thread_with_the_live_values_bit_for_bit(traced, live):
    assert traced.request("threads")["threads"] == [{"id": 1, "name": "rank 0"}, {"id": 2, "name": "rank 1"}]
    stop = traced.motion("restart", {})
    assert _walk(traced, stop, "next") == live


def test_stepping_back_across_every_collective_of_the_traces_reads_the_live_values(traced, live):
    stop = traced.motion("continue", {"threadId": 1})
    assert stop["reason"] == "end"
    back = _walk(traced, stop, "stepBack")  # across all_reduce #2 (tick 9) and #1 (tick 3), on both ranks
    assert back == live
    stop = traced.motion("continue", {"threadId": 1})  # forward again, across both: the recorded results
    assert (stop["reason"], tuple(rank_ticks(stop))) == ("end", (12, 12))


def _craft(folder: Path, case: str, good: Path) -> Path:
    """A copy of the recording in its own folder, its index rewritten (or a rank's trace changed) by `case`."""
    place = folder / case
    place.mkdir()
    for rank in (0, 1):
        shutil.copy(good.with_name(f"run.rank{rank}.rwtrace"), place / f"run.rank{rank}.rwtrace")
    data = good.read_bytes()
    magic, version, world = HEADER.unpack_from(data)
    body = msgpack.unpackb(data[HEADER.size + BODY.size:])
    rank1 = place / "run.rank1.rwtrace"
    payload = None
    if case == "not msgpack":
        payload = b"\xc1 not msgpack"
    elif case == "version 3":
        version = 3
    elif case == "no ranks":
        world = 0
    elif case == "too many ranks":
        world = 1_000_000
    elif case == "out of its folder":
        body["ranks"][1]["file"] = "../run.rwtrace"
    elif case == "a folder part":
        body["ranks"][1]["file"] = "sub/run.rank1.rwtrace"
    elif case == "missing":
        rank1.unlink()
    elif case == "a link":
        rank1.unlink()
        rank1.symlink_to(good.with_name("run.rank1.rwtrace"))
    elif case in ("changed", "damaged"):
        damaged = bytearray(rank1.read_bytes())
        damaged[:8] = b"NOTTRACE"
        rank1.write_bytes(bytes(damaged))
        if case == "damaged":  # the digest made to match: the trace's own reader refuses it
            body["ranks"][1]["sha256"] = hashlib.sha256(bytes(damaged)).hexdigest()
    elif case == "version 1":  # as written before sends and recvs were paired: no transfers
        version = 1
        for rank in body["ranks"]:
            for collective in rank["collectives"]:
                del collective["p2p"]
    elif case == "a bad group":
        body["groups"] = {"0": [1, 0]}
    elif case == "a bad transfer":
        body["ranks"][1]["collectives"][0]["p2p"] = [["sideways", 1, 0, "float32[4]"]]
    elif case == "other collectives":
        body["ranks"][1]["collectives"][1]["op"] = "all_gather_into_tensor"
    payload = payload if payload is not None else msgpack.packb(body, use_bin_type=True)
    index = place / "run.rwtrace"
    index.write_bytes(HEADER.pack(magic, version, world) + BODY.pack(len(payload), zlib.crc32(payload)) + payload)
    return index


@pytest.mark.parametrize("case, words", [
    ("not msgpack", "its body does not decode: it is not valid msgpack"),
    ("version 3", "is rank index format version 3; this reader reads versions 1 and 2"),
    ("no ranks", "says 0 ranks; a world size is from 1 to 64"),
    ("too many ranks", "says 1000000 ranks"),
    ("out of its folder", "rank 1's trace is named '../run.rwtrace': a file name in the index's own folder"),
    ("a folder part", "rank 1's trace is named 'sub/run.rank1.rwtrace'"),
    ("missing", "run.rank1.rwtrace is not there"),
    ("a link", "is a link"),
    ("changed", "rank 1's trace run.rank1.rwtrace does not match its SHA-256 in the index"),
    ("damaged", "run.rank1.rwtrace is not a Rewind trace (no trace header at offset 0)"),
    ("a bad group", "its group '0' is [1, 0], not ranks of the index in order"),
    ("a bad transfer", "rank 1's collective #1: its p2p transfers are [['sideways', 1, 0, 'float32[4]']]"),
    ("other collectives", "rank 1's trace run.rank1.rwtrace has all_reduce #2 (float32[4,8], sum) at "
                          "tensor_parallel.py:49 at tick 9 where the index says all_gather_into_tensor #2"),
])
def test_a_damaged_or_crafted_index_is_refused_in_words_and_the_server_goes_on(traced, folder, case, words):
    index = _craft(folder, case, folder / "run.rwtrace")
    refused(traced, "restart", {"arguments": {"trace": str(index)}}, words)
    assert traced.request("threads")["threads"] == []  # still serving, with no ranks left half-open


def test_a_recording_of_ranks_destroys_no_file(traced, folder):
    kept = folder / "kept"
    kept.mkdir()
    (kept / "run.rank1.rwtrace").write_text("the user's")
    refused(traced, "restart", {"arguments": {"program": str(TENSOR_PARALLEL), "ranks": 2,
                                               "record": str(kept / "run.rwtrace")}},
             f"cannot record to {kept / 'run.rank1.rwtrace'}: it exists; set overwrite to true to replace it")
    assert sorted(p.name for p in kept.iterdir()) == ["run.rank1.rwtrace"]
    assert (kept / "run.rank1.rwtrace").read_text() == "the user's"


def test_a_rendezvous_for_an_index_replicas_of_one_sessions_trace_or_a_nul_in_a_path_are_refused_in_words(
        traced, folder):
    index = str(folder / "run.rwtrace")
    refused(traced, "restart", {"arguments": {"trace": index, "ranks": 2, "rendezvous": "127.0.0.1:0"}},
             "a trace of ranks has no rendezvous")
    refused(traced, "restart", {"arguments": {"trace": str(folder / "run.rank0.rwtrace"), "replicas": ["linear"]}},
             "'replicas' compares values across ranks: this trace is one session's, not an index of ranks' traces")
    refused(traced, "restart", {"arguments": {"trace": "run\0.rwtrace", "cwd": str(folder), "ranks": 2}},
             "the path contains a NUL character")


@pytest.mark.parametrize("path, words", [("run\0.rwtrace", "the path contains a NUL character"),
                                         ("/proc/self/mem", "input/output error")])  # opens, and fails to read
def test_a_path_the_system_refuses_is_no_index_and_said_in_words(path, words):
    assert index_ranks(path) is None
    with pytest.raises(RewindError, match=f"^cannot read index .*: {words}$"):
        read_index(path)
    with pytest.raises(RewindError, match=f"^cannot read rank 1's trace .*: {words}$"):
        file_digest(Path(path), "rank 1's trace")


def test_each_rank_checks_its_own_traces_digest_and_reading_the_index_does_not(traced, folder):
    index = _craft(folder, "changed in place", folder / "run.rwtrace")  # a copy: the case changes nothing itself
    rank0, rank1 = read_index(str(index)).ranks
    changed = bytearray(rank1.path.read_bytes())
    changed[-1] ^= 1  # the same size: only its digest tells
    rank1.path.write_bytes(bytes(changed))
    assert read_index(str(index)).ranks == (rank0, rank1)
    check_rank_trace(str(index), 0, str(rank0.path), rank0.size, rank0.sha256)
    with pytest.raises(RewindError, match=re.escape(f"index {index}: rank 1's trace run.rank1.rwtrace does not match "
                                                    "its SHA-256 in the index (the file was changed or replaced)")):
        check_rank_trace(str(index), 1, str(rank1.path), rank1.size, rank1.sha256)


def test_an_index_of_version_1_reads_as_one_without_sends_or_recvs(traced, folder):
    old = read_index(str(_craft(folder, "version 1", folder / "run.rwtrace")))
    assert [rank.collectives for rank in old.ranks] == [rank.collectives
                                                        for rank in read_index(str(folder / "run.rwtrace")).ranks]


def test_after_refusals_the_index_opens_again(traced, folder, live):
    stop = traced.motion("restart", {"arguments": {"trace": str(folder / "run.rwtrace")}})
    assert (stop["reason"], tuple(rank_ticks(stop))) == ("end", (12, 12))
    assert {rank: _values(traced, rank + 1) for rank in (0, 1)} == live[(12, 12)]


@pytest.mark.parametrize("arguments, words", [
    ({"ranks": 3}, "holds 2 ranks' traces, not 3"),
    ({"program": str(TENSOR_PARALLEL)}, "open a trace of many ranks, or run a program (and record it): not both")])
def test_opening_an_index_with_other_ranks_or_a_program_is_refused(traced, folder, arguments, words):
    with pytest.raises(RewindError, match=re.escape(words)):
        Coordinator(trace=str(folder / "run.rwtrace"), **arguments)
