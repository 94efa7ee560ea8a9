"""Where values live: the caching allocator's segment and block for an address, and the reverse question,
which value lives at an address at a tick."""

from __future__ import annotations

from checkpoint.timeline import INITIAL
from hardware.drivers.torch.cuda_allocator import block_at
from hardware.session import LaunchOptions, Session
from tests.conftest import EXAMPLES, program

GPT = str(EXAMPLES / "gpt.py")

# torch.cuda.memory_snapshot(include_traces=False) as torch 2.13 builds it (segmentInfoToDict in
# torch/csrc/cuda/Module.cpp): every key it writes, the stream as the cudaStream_t's integer (0: the default
# stream), the pool id as a pair, and a block freed on one stream while another still uses it in its real state
# name. Three segments: the default pools' large and small ones, and one of a CUDA graph's private pool.
SNAPSHOT = [
    {"device": 0, "address": 0x7F0000000000, "total_size": 2 << 20, "allocated_size": 1 << 20,
     "active_size": 1 << 20, "requested_size": 1000000, "stream": 0, "segment_type": "large",
     "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
     "blocks": [{"address": 0x7F0000000000, "size": 1 << 20, "requested_size": 1000000,
                 "state": "active_allocated", "frames": []},
                {"address": 0x7F0000100000, "size": 1 << 20, "requested_size": 0, "state": "inactive", "frames": []}]},
    {"device": 0, "address": 0x7F0000200000, "total_size": 2 << 20, "allocated_size": 0, "active_size": 512,
     "requested_size": 500, "stream": 0x55D0C8A3E2F0, "segment_type": "small", "segment_pool_id": (0, 0),
     "is_expandable": False, "frames": [],
     "blocks": [{"address": 0x7F0000200000, "size": 512, "requested_size": 500, "state": "active_pending_free",
                 "frames": []},
                {"address": 0x7F0000200200, "size": (2 << 20) - 512, "requested_size": 0, "state": "inactive",
                 "frames": []}]},
    {"device": 0, "address": 0x7F0000400000, "total_size": 1 << 20, "allocated_size": 1 << 20,
     "active_size": 1 << 20, "requested_size": 512, "stream": 0x55D0C8A3E2F0, "segment_type": "small",
     "segment_pool_id": (1, 2), "is_expandable": False, "frames": [],
     "blocks": [{"address": 0x7F0000400000, "size": 1 << 20, "requested_size": 512, "state": "active_allocated",
                 "frames": []}]},
]


def test_an_address_resolves_to_its_segment_block_stream_and_pool():
    found = block_at(SNAPSHOT, 0x7F0000100010)
    assert (found["segment"], found["block"], found["offset_in_block"]) == (hex(0x7F0000000000), hex(0x7F0000100000), 16)
    assert (found["block_state"], found["stream"], found["pool"]) == ("inactive", 0, "large")
    pending = block_at(SNAPSHOT, 0x7F0000200100)
    assert (pending["block"], pending["block_state"], pending["pool"]) == (hex(0x7F0000200000), "active_pending_free",
                                                                           "small")
    graph = block_at(SNAPSHOT, 0x7F0000400200)
    assert (graph["stream"], graph["pool"], graph["requested_size"]) == (0x55D0C8A3E2F0, "small (private pool 1:2)",
                                                                         512)
    assert block_at(SNAPSHOT, 0x7F0000500000) == {}  # past the segments: not allocator memory
    assert block_at(SNAPSHOT, 0x7F0000000010, device=1) == {}


def _session(**options) -> Session:
    session = Session()
    session.launch(LaunchOptions(GPT, driver="torch:cpu", **options), program=program(GPT))
    session.goto(session.end)
    return session


def test_the_value_at_an_address_depends_on_the_tick():
    session = _session()
    tl = session.tl
    rec = next(r for r in tl.log if r.kind == "node output" and tl.last_use_tick(r.value) < tl.end - 1)
    address = rec.location.address + 8
    written = session.value_at(address, rec.tick + 1)
    assert (written["value"], written["version"], written["writtenBy"]) == (rec.value, rec.tick, rec.node_name)
    assert written["offset"] == 8 and written["live"] is True
    assert session.value_at(address, rec.tick).get("value") != rec.value  # not yet written
    last_read = tl.last_use_tick(rec.value)
    assert last_read > rec.tick
    still = session.value_at(address, last_read)  # its last reader has not run yet
    assert (still["value"], still["version"], still["live"]) == (rec.value, rec.tick, True)
    # Once its last reader ran the value is dead, but its bytes are still there: the checkpoint ring retains that
    # very tensor (the budget holds the whole run), so the CPU allocator cannot give its memory to another value.
    later = session.value_at(address, last_read + 1)
    assert (later["value"], later["version"], later["writtenBy"], later["offset"]) == (rec.value, rec.tick,
                                                                                       rec.node_name, 8)
    assert later["live"] is False and later["retained"] is True
    assert tl.ring.evictions == 0 and (rec.value, rec.tick) in tl.ring


def test_program_memory_and_checkpoint_copies_are_named_at_their_addresses():
    session = _session(device_pool=True)
    tl = session.tl
    param = next(n for n in tl.initial if n.startswith("p_"))
    owned = session.value_at(tl.driver.locate(tl.initial[param]).address + 4)
    assert (owned["value"], owned["kind"], owned["version"], owned["offset"]) == (param, "program value", "initial", 4)
    pool = tl.ring.pool
    key = next(k for k in tl.ring.keys() if k[1] != INITIAL and pool.holds(tl.ring.get(k)))
    copy = session.value_at(tl.ring.get(key).data_ptr())
    assert (copy["value"], copy["version"], copy["kind"], copy["retained"]) == (key[0], key[1], "checkpoint copy", True)
    assert session.value_at(pool.base + pool.capacity + 4096)["found"] is False
