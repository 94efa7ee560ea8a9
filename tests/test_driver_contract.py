"""The driver contract is all a new chip needs: a driver implementing only its required methods runs a real
Program forward and back bit for bit, through a Timeline and through a Session. What some chips do besides
is a capability, found with `isinstance`; without one, the engine falls back to what it meant before."""

from __future__ import annotations

import hashlib
import math
from typing import Any, Hashable, Mapping

import pytest
import torch

import hardware.session.session as session_module
from checkpoint.timeline import Timeline
from hardware import driver as contract
from hardware.driver import (AllocatorInfo, BatchedChecks, Chip, Driver, Forgets, HostValues, MemorySpace,
                             PlacesValues, PoolsCheckpoints, Precision, Timing, Unit, WriteStats)
from hardware.drivers import open_driver
from hardware.errors import DriverError
from hardware.frontends.torch_export import load_program
from hardware.instructions import InstructionDriver
from hardware.memory import Location
from hardware.program import Node, Program
from hardware.session import LaunchOptions, Session
from tests.conftest import EXAMPLES

REQUIRED = {"describe", "load", "execute", "locate", "inspect", "read", "write", "copy_into", "clone", "storage"}


class TinyChip(Driver):
    """A new chip in the fewest lines: torch on the CPU, nothing but the required contract."""

    name = "tiny"

    def describe(self) -> Chip:
        return Chip("tiny", (Unit(0, "core"),), (MemorySpace("SRAM", 0, 2**48),))

    def load(self, program: Program) -> Mapping[str, Any]:
        return {name: t.detach().clone() for name, t in program.initial.items()}

    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        with torch.no_grad():
            out = node.target(*args, **kwargs)
        return [out] if isinstance(out, torch.Tensor) else [out[i] for i in node.output_indices]

    def locate(self, tensor: Any, unit: str | None = None) -> Location:
        return Location("tiny", unit or "core", "SRAM", tensor.data_ptr(), tensor.numel() * tensor.element_size(),
                        str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tuple(tensor.stride()))

    def inspect(self, tensor: Any) -> WriteStats:
        raw = self._bytes(tensor)
        digest = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little", signed=True)
        x = tensor.double().reshape(-1)
        finite = x[torch.isfinite(x)]
        nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        if not finite.numel():
            return WriteStats(digest, nan, inf, math.nan, math.nan, math.nan)
        return WriteStats(digest, nan, inf, float(finite.min()), float(finite.max()), float(finite.mean()))

    def read(self, tensor: Any, offset: int, count: int) -> bytes:
        return self._bytes(tensor)[offset:offset + count]

    def write(self, tensor: Any, offset: int, data: bytes) -> None:
        flat = tensor.view(-1).view(torch.uint8)
        flat[offset:offset + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def copy_into(self, dst: Any, src: Any) -> None:
        with torch.no_grad():
            dst.copy_(src)

    def clone(self, tensor: Any) -> Any:
        return tensor.clone()

    def storage(self, tensor: Any) -> tuple[Hashable, int]:
        return tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()

    @staticmethod
    def _bytes(tensor: Any) -> bytes:
        return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def mlp() -> Program:
    return load_program(EXAMPLES / "mlp.py")


def _raw(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_the_contract_is_the_required_methods_only():
    assert Driver.__abstractmethods__ == REQUIRED
    assert {name for name, v in vars(Driver).items() if callable(v)} == REQUIRED


def test_a_chip_with_only_the_contract_runs_a_program_forward_and_back_bit_for_bit(mlp):
    tl = Timeline(mlp, TinyChip(), budget=256, every=2)  # a ring too small for the run: versions are recomputed
    reference = Timeline(mlp, open_driver("torch:cpu"), budget=64 << 20)
    seen: dict[int, dict[str, bytes]] = {}
    for position in range(tl.end + 1):
        tl.seek(position)
        reference.seek(position)
        seen[position] = {name: _raw(tl.value(name)) for name in tl.live()}
        assert seen[position] == {name: _raw(reference.value(name)) for name in reference.live()}, position
    for position in reversed(range(tl.end + 1)):
        tl.seek(position)
        assert {name: _raw(tl.value(name)) for name in tl.live()} == seen[position], position
    assert tl.recomputed > 0 and tl.ring.evictions > 0 and not tl.nondeterminism
    assert tl.checks is None and tl.seconds and all(s >= 0 for s in tl.seconds.values())  # the host's clock
    row = tl.log.row(0)
    assert row[3] and tl.log.digests_at(0)  # every write logged with the chip's own digest


def test_a_chip_with_only_the_contract_runs_in_a_session(mlp, monkeypatch):
    monkeypatch.setattr(session_module, "open_driver", lambda spec, options=None: TinyChip())
    session = Session()
    session.launch(LaunchOptions(str(EXAMPLES / "mlp.py"), driver="tiny", budget_mb=0.001, every=2), program=mlp)
    tl = session.tl
    session.goto(tl.end)
    at_end = {name: _raw(tl.value(name)) for name in tl.live()}
    session.goto(2)
    before = {name: _raw(tl.value(name)) for name in tl.live()}
    session.goto(tl.end)
    assert {name: _raw(tl.value(name)) for name in tl.live()} == at_end
    session.goto(2)
    assert {name: _raw(tl.value(name)) for name in tl.live()} == before
    assert not tl.nondeterminism
    session.close()


def test_isinstance_finds_each_drivers_capabilities():
    torch_cpu, sim, tiny = open_driver("torch:cpu"), open_driver("sim"), TinyChip()
    for capability in (HostValues, Precision, AllocatorInfo, Timing, BatchedChecks, PoolsCheckpoints):
        assert isinstance(torch_cpu, capability), capability
    for capability in (PlacesValues, Forgets, InstructionDriver):
        assert not isinstance(torch_cpu, capability), capability
    for capability in (HostValues, PlacesValues, Forgets, InstructionDriver):
        assert isinstance(sim, capability), capability
    for capability in (Precision, Timing, BatchedChecks, PoolsCheckpoints):
        assert not isinstance(sim, capability), capability
    assert contract.capabilities(tiny) == frozenset()
    assert contract.capabilities(sim) == {c for c in contract.CAPABILITIES if isinstance(sim, c)}


def test_without_a_capability_the_engine_falls_back_to_what_it_meant(mlp):
    tiny = TinyChip()
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert isinstance(contract.mark(tiny), float) and contract.seconds_between(tiny, 1.0, 1.5) == 0.5
    assert contract.locate_value(tiny, "x", x) == tiny.locate(x)
    assert contract.placement_of(tiny, "x", x) == (tiny.locate(x),)
    assert contract.allocator_info(tiny, x.data_ptr()) == {}
    assert contract.check_batch(tiny) == 1 and not contract.pools_checkpoints(tiny)
    assert contract.read_checks(tiny, [contract.check(tiny, x)], [x]).stats() == [tiny.inspect(x)]
    contract.forget(tiny, [0])
    with pytest.raises(DriverError, match="cannot copy values to the host"):
        contract.to_host(tiny, x)
    with pytest.raises(DriverError, match="cannot run a node at another precision"):
        contract.execute_at(tiny, mlp.nodes[0], (), {}, "float64")
    with pytest.raises(DriverError, match="has no device-side checkpoint pool"):
        Timeline(mlp, tiny, budget=1 << 20, device_pool=True)


def test_the_drivers_answer_through_the_capabilities_as_they_did(mlp):
    torch_cpu, sim = open_driver("torch:cpu"), open_driver("sim")
    sim.load(mlp)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert contract.placement_of(torch_cpu, "x", x) == (torch_cpu.locate(x),)
    name = mlp.outputs[0]
    assert contract.locate_value(sim, name, x).space == "DRAM"  # the sim chip places values by name
    assert contract.check_batch(torch_cpu) == 1 and not contract.pools_checkpoints(torch_cpu)
    assert torch.equal(contract.execute_at(torch_cpu, mlp.nodes[0], *mlp.nodes[0].bind(mlp.initial.__getitem__),
                                           "float64")[0],
                       torch_cpu.execute(mlp.nodes[0], *mlp.nodes[0].bind(
                           lambda n: mlp.initial[n].double()))[0])
