"""The device tier of the ring on a CPU pool: the same DevicePool class a GPU uses, copying synchronously."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from hardware.drivers.torch.device_pool import ALIGN, DevicePool
from checkpoint.ring import Checkpoint, Ring
from checkpoint.spill import PinnedSpill
from checkpoint.tiers import HostTier
from checkpoint.timeline import Timeline
from hardware.drivers.torch import TorchDriver
from hardware.errors import RewindError
from tests.conftest import EXAMPLES, program

GPT = str(EXAMPLES / "gpt.py")


def _timeline(budget: int, pool: bool, host_mb: float = 0) -> Timeline:
    tiers = HostTier(int(host_mb * 2**20)) if host_mb else None
    return Timeline(program(GPT), TorchDriver.from_spec("torch:cpu"), budget=budget, device_pool=pool, tiers=tiers)


def _live_values(tl: Timeline, tick: int) -> dict[str, torch.Tensor]:
    tl.seek(tick)
    return {name: tl.value(name).clone() for name in tl.live()}


def test_the_pool_carves_first_fit_and_coalesces_freed_neighbours():
    pool = DevicePool(4 * ALIGN, "cpu")
    views = [pool.adopt(torch.full((ALIGN // 4 - 3,), float(i))) for i in range(3)]
    keys = [pool.storage_of(v)[0] for v in views]
    assert [k[1] for k in keys] == [0, ALIGN, 2 * ALIGN]
    assert [float(v[0]) for v in views] == [0.0, 1.0, 2.0]
    pool.release(keys[1])
    assert not pool.fits(2 * ALIGN)  # two free ranges of ALIGN, not adjacent
    pool.release(keys[0])
    assert pool.free_ranges() == [(0, 2 * ALIGN), (3 * ALIGN, ALIGN)] and pool.fits(2 * ALIGN)
    with pytest.raises(RewindError, match="no free range"):
        pool.adopt(torch.zeros(3 * ALIGN, dtype=torch.uint8))


def test_a_pool_named_without_the_index_its_tensors_report_still_knows_its_own_views():
    pool = DevicePool(4 * ALIGN, "cpu:0")  # as `cuda` is `cuda:0` to the tensors on it, `cpu:0` is `cpu`
    view = pool.adopt(torch.arange(8.0))
    assert pool.holds(view) and pool.cost(view) == 0 and pool.adopt(view) is view and pool.copies == 1


def test_the_compute_stream_waits_once_for_each_copy_at_its_first_read():
    pool = DevicePool(2 * ALIGN, "cpu")
    ring = Ring(2 * ALIGN, lambda t: (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()), pool=pool)

    def put(key, value: float) -> None:
        assert ring.put(key, torch.full((16,), value), protect=lambda k: False, distance=lambda k: 0, position=0)

    put(("a", 0), 1.0)
    put(("b", 0), 2.0)
    assert (pool.copies, pool.waits) == (2, 0)  # copied on the side stream, read by nothing yet
    first = ring.get(("a", 0))
    assert ring.get(("a", 0)) is first and float(first[0]) == 1.0 and pool.waits == 1
    ring.drop(("a", 0))
    put(("c", 0), 3.0)  # a new copy into the freed slot: a new wait at its first read
    assert pool.slot_of(ring.get(("c", 0))) == 0 and float(ring.get(("c", 0))[0]) == 3.0 and pool.waits == 2


def test_views_of_a_copied_storage_share_its_slot_while_that_storage_lives():
    pool = DevicePool(8 * ALIGN, "cpu")
    backing = np.arange(64, dtype=np.float32)
    base = torch.from_numpy(backing)
    copy = pool.adopt(base)
    view = base.reshape(8, 8).t()[2:]
    assert pool.cost(view) == 0
    shared = pool.adopt(view)
    assert pool.slot_of(shared) == pool.slot_of(copy) and torch.equal(shared, view)
    del base, view
    gc.collect()
    reborn = torch.from_numpy(backing)  # a new storage at the very same address
    assert pool.cost(reborn) > 0


def test_a_pooled_ring_retains_copies_and_replays_the_same_values_and_digests():
    by_reference, pooled = _timeline(64 << 20, False), _timeline(64 << 20, True)
    for tl in (by_reference, pooled):
        tl.seek(tl.end)
    assert [r.digest for r in pooled.log] == [r.digest for r in by_reference.log]
    pool = pooled.ring.pool
    retained = [pooled.ring.get(k) for k in pooled.ring.keys()]
    owned = [t for t in retained if t.untyped_storage().data_ptr() in pooled.ring.free_storages]
    assert all(pool.holds(t) for t in retained if not any(t is o for o in owned))  # the Program's own: by reference
    assert len(retained) - len(owned) > 30 and pool.copies > 30
    assert pool.used == pooled.ring.used <= pooled.ring.budget
    for tick in (40, 7, 25):
        expected = _live_values(by_reference, tick)
        got = _live_values(pooled, tick)
        assert expected.keys() == got.keys()
        assert all(torch.equal(expected[n], got[n]) for n in expected)


def test_an_evicting_pool_spills_through_staging_into_lz4_and_steps_back_exactly():
    reference, pooled = _timeline(64 << 20, False), _timeline(32 << 10, True, host_mb=64)
    for tl in (reference, pooled):
        tl.seek(tl.end)
    assert isinstance(pooled.tiers, PinnedSpill)
    assert pooled.ring.evictions > 0 and pooled.tiers.staged > 0
    assert pooled.ring.peak <= pooled.ring.budget
    for tick in (50, 12, 33):
        expected, got = _live_values(reference, tick), _live_values(pooled, tick)
        assert all(torch.equal(expected[n], got[n]) for n in expected)
    tiers = {c.tier for c in pooled.checkpoints()}
    assert "host (lz4)" in tiers
    pooled.tiers.close()  # lands every staged version in the host tier
    assert pooled.tiers.in_flight == 0 and pooled.tiers.below.raw > pooled.tiers.below.used > 0


def test_a_value_read_from_the_pool_keeps_its_elements_after_the_ring_reuses_its_slot():
    """The pool hands a slot to another version once the ring lets go of it; a tensor a reader holds (a
    variables page, one side of a comparison) must not change under it."""
    reference, pooled = _timeline(64 << 20, False), _timeline(32 << 10, True)
    for tl in (reference, pooled):
        tl.seek(tl.end)
    held = {tick: _live_values(reference, tick) for tick in (50, 12, 33)}
    read = {}
    for tick in held:
        pooled.seek(tick)
        read[tick] = {name: pooled.value(name) for name in pooled.live()}  # held without a copy of their own
    assert pooled.ring.evictions > 0 and pooled.ring.pool.copies > len(pooled.ring.keys())
    for tick, values in held.items():
        assert all(torch.equal(values[n], read[tick][n]) for n in values), tick


def test_a_budget_larger_than_the_free_memory_gets_the_pool_that_fits_and_says_so():
    driver, said = TorchDriver.from_spec("torch:cpu"), []
    driver.on_report = said.append
    tl = Timeline(program(GPT), driver, budget=1 << 50, device_pool=True)  # a petabyte
    assert tl.ring.pool.capacity == tl.ring.budget == tl.budget < 1 << 50
    assert any("does not fit" in s and "device pool holds" in s for s in said)
    tl.seek(tl.end)
    assert tl.ring.used <= tl.budget


def test_recomputing_a_value_keeps_an_input_found_in_the_ring_while_its_sibling_loads_from_a_lower_tier():
    """Loading one input of a node from the host tier makes room in the ring; the other input, found there a
    moment before, must not be the version evicted for it."""
    tl = Timeline(program(GPT), TorchDriver.from_spec("torch:cpu"), budget=64 << 20, tiers=HostTier(64 << 20))
    tl.seek(tl.end)
    values = tl.program.values
    node = next(n for n in tl.program.nodes
                if len(ins := [i for i in n.input_names() if values[i].producer is not None]) == 2
                and tl.node_tick[values[ins[0]].producer] != tl.node_tick[values[ins[1]].producer])
    (a, b), out = [i for i in node.input_names() if values[i].producer is not None], node.outputs[0]
    key_a, key_b = [(n, tl.node_tick[values[n].producer]) for n in (a, b)]
    expected = tl.value_version(out, tl.node_tick[node.index]).clone()
    tl.tiers.put(key_b, tl.ring.get(key_b).clone())
    for key in tl.ring.keys():  # only `a` stays in the ring, `b` only in the host tier, the output nowhere
        if key != key_a:
            tl.ring.drop(key)
    tl.ring.checkpoints = {0: tl.ring.checkpoints[0]}
    tl.store.frontier_values.clear()
    tl.ring.budget = tl.ring.used + 1  # loading `b` needs the room `a` takes
    assert torch.equal(tl.value_version(out, tl.node_tick[node.index]), expected)


def _spilled_version(tl: Timeline) -> tuple[tuple[str, int], torch.Tensor]:
    """A version only the host tier holds, whose node's inputs are all in the ring."""
    for key in sorted(tl.ring.keys(), key=lambda k: -k[1]):
        node = tl.node_at(key[1])
        if node is None or key[0] in tl.physical:
            continue
        inputs = [(i, tl.version_at(i, key[1])) for i in node.input_names()]
        if all(v == -1 or (i, v) in tl.ring for i, v in inputs):
            tensor = tl.ring.get(key).clone()
            tl.tiers.put(key, tensor)
            tl.ring.drop(key)
            tl.store.frontier_values.clear()
            return key, tensor
    raise AssertionError("no version with its inputs retained")


@pytest.mark.parametrize("tier_bytes_per_s, path", [(1.0, "recomputed"), (1e18, "loaded")])
def test_a_spilled_version_is_recomputed_or_loaded_whichever_its_measured_costs_say_is_quicker(tier_bytes_per_s,
                                                                                                 path):
    tl = Timeline(program(GPT), TorchDriver.from_spec("torch:cpu"), budget=64 << 20, tiers=HostTier(64 << 20))
    tl.seek(tl.end)
    key, expected = _spilled_version(tl)
    tl.store.load_rate = tier_bytes_per_s  # as if the tier's last loads ran at this rate
    before = {"recomputed": tl.recomputed, "loaded": tl.loaded}
    assert torch.equal(tl.value_version(*key), expected)
    assert {k: getattr(tl, k) - v for k, v in before.items()} == {k: int(k == path) for k in before}


def test_a_big_version_fits_by_evicting_what_was_retained_since_the_candidates_were_sorted():
    class Sized:
        def __init__(self, n: int):
            self.n = n

    ring = Ring(320, lambda t: (id(t), t.n))
    ring.checkpoints[0] = Checkpoint(0, frozenset())
    held = []

    def put(i: int, n: int) -> bool:
        held.append(Sized(n))
        return ring.put(("v", i), held[-1], protect=lambda k: False, distance=lambda k: (1, 1000 - k[1]),
                        position=1000)

    assert all(put(i, 32) for i in range(13))  # the 11th sorts the candidates; two more are retained after
    assert put(99, 300) and ring.used == 300 <= ring.budget  # not refused while others could go
