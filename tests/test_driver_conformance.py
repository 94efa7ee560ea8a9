"""The driver conformance suite: the same Programs through the same Session on every driver.

Every driver computes what the torch CPU driver computes (within the tolerance of a different summation
order), stepping back restores memory bit for bit, and where a driver says a value lives, its memory
holds the value's bytes.
"""

import numpy as np
import pytest
import torch

from hardware.session import Direction
from tests.conftest import EXAMPLES, open_session

DRIVERS = ["torch:cpu", "sim", "sim:npu"]
PROGRAMS = ["gpt.py", "mlp.py", "kv_cache.py"]


def values_at_end(path, driver: str) -> dict[str, torch.Tensor]:
    session = open_session(EXAMPLES / path, driver=driver)
    tl = session.tl
    tl.seek(tl.end)
    return {name: tl.value(name, tick + 1) for name, ticks in tl.versions.items() for tick in ticks[-1:] if tick >= 0}


@pytest.fixture(scope="module")
def reference():
    return {path: values_at_end(path, "torch:cpu") for path in PROGRAMS}


@pytest.mark.parametrize("driver", DRIVERS[1:])
@pytest.mark.parametrize("path", PROGRAMS)
def test_every_value_matches_the_torch_cpu_driver(reference, path, driver):
    got = values_at_end(path, driver)
    assert set(got) == set(reference[path])
    for name, expected in reference[path].items():
        torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("driver", DRIVERS)
def test_stepping_back_restores_every_live_value_bit_for_bit(driver):
    session = open_session(EXAMPLES / "gpt.py", driver=driver, budget_mb=0.1, every=4)
    tl = session.tl
    seen = {}
    for position in range(0, tl.end + 1, 5):
        session.goto(position)
        seen[position] = {name: tl.value(name).clone() for name in tl.live()}
    session.goto(tl.end)
    for position in sorted(seen, reverse=True):
        session.goto(position + 1) if position < tl.end else None
        if position < tl.end:
            session.step(Direction.REVERSE, "instruction")
        assert tl.position == position
        assert set(tl.live()) == set(seen[position])
        for name, tensor in seen[position].items():
            assert torch.equal(tl.value(name), tensor), (position, name)
    assert tl.ring.evictions + tl.recomputed > 0 and not tl.nondeterminism  # values were let go, or never kept


def test_stepping_back_inside_a_node_restores_chip_memory_bit_for_bit():
    """Drivers that run nodes as instruction streams: a core's local memory and the node's DRAM, read by address."""
    session = open_session(EXAMPLES / "gpt.py", driver="sim:npu", schedule="random", seed=11)
    node = next(n for n in session.program.nodes if n.op == "aten.layer_norm.default")
    session.goto(node.index)
    config = session.tl.driver.config
    windows = [(config.local_address(c, 0), config.local_bytes) for c in range(config.cores)]
    windows += [(session.locate(n).shards[0].address, session.tl.driver.plan.buffers[n].nbytes)
                for n in node.input_names()]

    def memory():
        return [session.read_address(a, n) for a, n in windows]

    states = []
    for _ in range(25):
        session.step(granularity="instruction")
        states.append(memory())
    for state in reversed(states[:-1]):
        session.step(Direction.REVERSE, "instruction")
        assert memory() == state


@pytest.mark.parametrize("driver", DRIVERS)
def test_where_a_value_lives_its_bytes_are(driver):
    session = open_session(EXAMPLES / "gpt.py", driver=driver)
    session.goto(30)
    for name in session.live_values():
        value = session.tensor(name).contiguous()
        raw = value.reshape(-1).view(torch.uint8).numpy().tobytes()
        assert session.read_memory(name, 0, len(raw)) == raw, name
        placement = session.locate(name)
        assert placement.shards
        if driver.startswith("sim"):
            _shards_hold_their_elements(session, placement, value)
        else:
            assert placement.shards[0].address == value.data_ptr() or name in session.tl.physical


def _shards_hold_their_elements(session, placement, value) -> None:
    """Each shard's rows, read at its physical address, are its elements of the value's [rows, last dim] view."""
    matrix = value.reshape(-1, value.shape[-1] if value.dim() else 1).numpy()
    covered = np.zeros(matrix.shape, bool)
    for shard in placement.shards:
        (r0, r1), (c0, c1) = shard.elements
        row_bytes = matrix.shape[1] * matrix.itemsize
        for r in range(r0, r1):
            address = shard.address + (r - r0) * row_bytes
            got = np.frombuffer(session.read_address(address, (c1 - c0) * matrix.itemsize), matrix.dtype)
            assert np.array_equal(got, matrix[r, c0:c1]), (placement.value, shard.unit, r)
        covered[r0:r1, c0:c1] = True
    assert covered.all(), placement.value


def test_factory_ops_run_on_the_drivers_device_not_the_one_the_program_was_exported_on():
    """torch.export records `device=cpu` on the mask's `ones`: on another device (here `meta`, which any
    machine has) the driver makes it there, so masked_fill meets its mask on one device."""
    from hardware.drivers.torch import TorchDriver
    from tests.conftest import program

    prog = program(str(EXAMPLES / "gpt.py"))
    assert any(n.kwargs.get("device") == torch.device("cpu") for n in prog.nodes)
    driver = TorchDriver(torch.device("meta"))
    env = dict(driver.load(prog))
    for node in prog.nodes:
        args, kwargs = node.bind(env.__getitem__)
        env.update(zip(node.outputs, driver.execute(node, args, kwargs)))
    assert {t.device.type for t in env.values()} == {"meta"}
