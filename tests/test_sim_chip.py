"""The sim chip: launch errors name their cause, schedules replay bit for bit, and the fault-injection knobs
produce the races and hangs they stand for."""

import numpy as np
import pytest

from hardware.drivers import open_driver
from hardware.errors import DriverError, UnsupportedOpError
from tests.conftest import EXAMPLES, open_session, program

GPT = EXAMPLES / "gpt.py"


def run_to_end(**options):
    session = open_session(GPT, driver=options.pop("driver", "sim"), **options)
    session.goto(session.end)
    return session


def schedules(session) -> list:
    return [session.interleaving(n.index) for n in session.program.nodes]


def test_an_op_the_chip_cannot_lower_is_named_with_its_node_and_line_at_launch():
    with pytest.raises(UnsupportedOpError) as err:
        open_session(EXAMPLES / "noisy.py", driver="sim")
    assert "aten.randn_like.default" in str(err.value) and "'randn_like'" in str(err.value)
    assert "noisy.py:" in str(err.value)


@pytest.mark.parametrize("spec, options, message", [
    ("sim:tpu", {}, "unknown sim chip 'tpu'"),
    ("sim", {"schedule": "fifo"}, "unknown schedule 'fifo'"),
    ("sim", {"seed": "x"}, "seed must be an integer"),
    ("sim", {"faults": [{"kind": "flip_bit", "node": "add"}]}, "kind 'flip_bit' is not one of"),
    ("sim", {"faults": [{"kind": "drop_barrier", "node": "add"}]}, "needs a 'unit'"),
    ("sim", {"faults": [{"kind": "drop_barrier", "node": "add", "unit": "core 99"}]}, "not a core of sim:default"),
    ("sim", {"faults": [{"kind": "skip_dma_wait", "node": "add", "unit": 0, "when": 3}]}, "unknown field(s) when"),
    ("torch:cpu", {"seed": 1}, "takes no options (seed)"),
])
def test_bad_driver_specs_and_options_are_named(spec, options, message):
    with pytest.raises(DriverError, match=None) as err:
        open_driver(spec, options)
    assert message in str(err.value)


def test_a_fault_in_a_node_without_that_synchronisation_is_refused_at_launch():
    driver = open_driver("sim", {"faults": [{"kind": "drop_barrier", "node": "embedding", "unit": "core 0"}]})
    with pytest.raises(DriverError, match="has no barrier number 0"):
        driver.load(program(str(GPT)))


@pytest.fixture(scope="module")
def random_run():
    return run_to_end(schedule="random", seed=7, budget_mb=0.05, every=4)


def test_a_random_schedule_is_race_free_and_replays_bit_for_bit_when_values_are_recomputed(random_run):
    session, tl = random_run, random_run.tl
    assert all(not s.races and s.hang is None for s in schedules(session))
    recorded = {r.value: r.digest for r in tl.log if r.kind == "node output"}
    for tick in range(tl.end, 0, -7):  # a small ring: most of these are recomputed, replaying their schedules
        tl.seek(tick)
        for name in tl.live():
            if name in recorded and tl.version_at(name, tick) >= 0:
                assert tl.driver.inspect(tl.value(name)).digest == recorded[name], name
    assert tl.ring.evictions > 0 and not tl.nondeterminism


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another(random_run):
    again = run_to_end(schedule="random", seed=7)
    other = run_to_end(schedule="random", seed=8)
    first = schedules(random_run)
    assert all(np.array_equal(a.units, b.units) for a, b in zip(first, schedules(again)))
    assert any(not np.array_equal(a.units, b.units) for a, b in zip(first, schedules(other)))


def test_a_long_reduction_splits_k_across_the_gang_with_a_semaphore_and_atomic_adds():
    driver = open_driver("sim")
    driver.load(program(str(GPT)))
    down = next(n for n in program(str(GPT)).nodes if n.name == "linear_3")  # 128 -> 32: K is long
    ops = [ins.op for stream in driver.kernels[down.index].programs for ins in stream]
    assert {"sig", "wait", "atom.add"} <= set(ops)


def test_a_dropped_barrier_is_a_race_naming_both_units_instructions_the_range_tensor_and_node():
    session = run_to_end(faults=[{"kind": "drop_barrier", "node": "layer_norm", "unit": "core 3"}])
    node = next(n for n in session.program.nodes if n.name == "layer_norm")
    race = session.interleaving(node.index).races[0]
    names = session.units()
    assert "core 3" in names[race.second_unit] or "dma 3" in names[race.second_unit]
    assert race.first_unit != race.second_unit and race.first_step < race.second_step
    assert race.space == "DRAM" and race.nbytes > 0 and race.tensor == "partial sums of layer_norm"
    assert race.kind in ("write-read", "read-write")


def test_a_skipped_dma_wait_is_a_race_between_the_engine_and_its_core_on_a_local_tile():
    session = run_to_end(faults=[{"kind": "skip_dma_wait", "node": "linear", "unit": "core 0"}])
    node = next(n for n in session.program.nodes if n.name == "linear")
    race = session.interleaving(node.index).races[0]
    names = session.units()
    assert {names[race.first_unit], names[race.second_unit]} == {"dma 0 (gang 0)", "core 0 (gang 0)"}
    assert race.space == "SRAM core 0" and race.kind == "write-read"
    assert 0x1000_0000 <= race.address < 0x1000_0000 + 0x10_0000


def test_a_miscounted_barrier_hangs_the_gang_with_a_wait_for_graph():
    session = run_to_end(faults=[{"kind": "miscount_barrier", "node": "softmax"}])
    node = next(n for n in session.program.nodes if n.name == "softmax")
    hang = session.interleaving(node.index).hang
    assert hang is not None and len(hang.waits) == 8
    assert all(w.what == "barrier 0" and "8 of 9 arrived; 1 more that no unit will make" in w.detail
               for w in hang.waits)
    assert sorted(w.since for w in hang.waits) == [w.since for w in hang.waits]


def test_a_dropped_signal_hangs_the_followers_on_a_semaphore_nobody_signals():
    session = run_to_end(faults=[{"kind": "drop_signal", "node": "linear_3", "unit": "core 0"}])
    node = next(n for n in session.program.nodes if n.name == "linear_3")
    hang = session.interleaving(node.index).hang
    assert {w.what for w in hang.waits} == {"semaphore 0"}
    assert all("no unit will signal" in w.detail and not w.waiting_for for w in hang.waits)
