"""Instruction-level debugging on the sim chip through the Session: stepping units both ways restores
the chip bit for bit, instruction breakpoints, race and hang stops, and memory by physical address."""

import numpy as np
import pytest

from hardware.errors import RewindError
from hardware.session import Direction, InstructionSpec
from tests.conftest import EXAMPLES, open_session

GPT = EXAMPLES / "gpt.py"
BACK = Direction.REVERSE


def instruction(session, direction=Direction.FORWARD, **kw):
    return session.step(direction, "instruction", **kw)


def chip_memory(session) -> tuple[np.ndarray, np.ndarray]:
    m = session.tl.driver.memories
    return m.dram.copy(), m.local.copy()


def node_named(session, name: str):
    return next(n for n in session.program.nodes if n.name == name)


@pytest.fixture(scope="module")
def gpt():
    return open_session(GPT, driver="sim", schedule="random", seed=3)


def test_stepping_back_one_instruction_at_a_time_restores_chip_memory_bit_for_bit(gpt):
    gpt.goto(node_named(gpt, "layer_norm").index)
    seen = []
    for _ in range(40):
        instruction(gpt)
        gpt.read_address(0x1000_0000, 4)  # puts the chip in the state of the position
        seen.append((gpt.position, gpt.instruction, chip_memory(gpt)))
    for position, step, (dram, local) in reversed(seen):
        assert (gpt.position, gpt.instruction) == (position, step)
        gpt.read_address(0x1000_0000, 4)
        assert np.array_equal(gpt.tl.driver.memories.dram, dram) and np.array_equal(gpt.tl.driver.memories.local, local)
        instruction(gpt, BACK)


def test_a_unit_step_runs_the_recorded_interleaving_until_that_unit_has_stepped(gpt):
    gpt.goto(node_named(gpt, "linear").index)
    unit = gpt.units().index("core 17 (gang 2)")
    schedule = gpt.interleaving()
    first = int(np.flatnonzero(schedule.units == unit)[0])
    instruction(gpt, unit=unit)
    assert gpt.instruction == first + 1
    instruction(gpt, BACK, unit=unit)
    assert gpt.instruction == first


def test_a_single_thread_step_runs_that_unit_alone_and_rewrites_the_nodes_interleaving():
    session = open_session(GPT, driver="sim")
    node = node_named(session, "linear_1")
    session.goto(node.index)
    unit = session.units().index("core 9 (gang 1)")
    assert int(session.interleaving().units[0]) != unit
    instruction(session, unit=unit, single_thread=True)
    assert (session.position, session.instruction) == (node.index, 1)
    assert int(session.interleaving().units[0]) == unit
    session.goto(session.end)  # the rewritten future runs again: the kernel is race free, so nothing changes
    assert not session.tl.nondeterminism
    assert not any(session.interleaving(n.index).races for n in session.program.nodes)


def test_a_blocked_unit_cannot_step_alone(gpt):
    gpt.goto(node_named(gpt, "embedding").index)
    while "blocked" not in {u.status for u in gpt.unit_states()[:32]}:
        instruction(gpt)
    blocked = next(u for u in gpt.unit_states() if u.status == "blocked")
    with pytest.raises(RewindError, match="cannot step alone.*on DMA tag"):
        instruction(gpt, unit=blocked.unit, single_thread=True)


def test_an_instruction_breakpoint_from_the_disassembly_stops_before_it_in_both_directions(gpt):
    node = node_named(gpt, "softmax")
    gpt.goto(node.index)
    unit = gpt.units().index("core 5 (gang 0)")
    listing = gpt.disassemble(unit)
    target = next(i for i in listing if i["instruction"].startswith("red.sum"))
    assert target["source"]["line"] == node.loc.line and target["node"] == "softmax"
    [bp] = gpt.set_instruction_breakpoints([InstructionSpec(target["address"])])
    gpt.goto(0)
    stop = gpt.run()
    assert stop.reason == "instruction breakpoint" and stop.breakpoint_ids == [bp.id]
    assert gpt.position == node.index
    top = gpt.frames(unit=unit)[0]
    assert top.instruction_pointer == int(target["address"], 16) and top.line == node.loc.line
    assert "red.sum" in top.name and f"pc {target['pc']}" in top.name
    gpt.goto(gpt.end)
    back = gpt.run(BACK)
    assert (back.reason, back.tick, back.instruction) == (stop.reason, stop.tick, stop.instruction)
    gpt.set_instruction_breakpoints([])


def test_instruction_breakpoints_that_name_no_instruction_are_unverified(gpt):
    bad = gpt.set_instruction_breakpoints([InstructionSpec("0x10"), InstructionSpec("pc 3"),
                                           InstructionSpec(gpt.disassemble(1)[0]["address"], condition="x > 0")])
    assert [bp.verified for bp in bad] == [False, False, False]
    assert "no instruction at 0x10" in bad[0].message and "not an instruction address" in bad[1].message
    gpt.set_instruction_breakpoints([])


@pytest.fixture(scope="module")
def racy():
    session = open_session(GPT, driver="sim", faults=[{"kind": "drop_barrier", "node": "layer_norm_1",
                                                       "unit": "core 2"}])
    session.set_exception_filters({"race"})
    return session


def test_a_race_stops_after_the_second_access_and_reverses_to_the_instant_before_it(racy):
    stop = racy.run()
    race = stop.exception.evidence
    assert stop.reason == "exception" and stop.exception.filter == "race" and race["node"] == "layer_norm_1"
    second = race["instructions"][1]
    assert racy.units()[stop.unit] == second["unit"] and stop.instruction == second["step"] + 1
    start, end = (int(a, 16) for a in race["addresses"])
    after = racy.read_address(start, end - start)
    instruction(racy, BACK)
    assert racy.instruction == second["step"]
    about_to = next(u for u in racy.unit_states() if racy.units()[u.unit] == second["unit"])
    assert about_to.status in ("ready", "busy") and second["instruction"].split()[0] in about_to.detail
    again = racy.run()  # the recorded schedule replays the race
    assert (again.tick, again.instruction, again.description) == (stop.tick, stop.instruction, stop.description)
    assert racy.read_address(start, end - start) == after


def test_a_hang_stops_with_its_wait_for_graph_and_reverses_to_the_last_progress():
    session = open_session(GPT, driver="sim", faults=[{"kind": "miscount_barrier", "node": "softmax_1"}])
    session.set_exception_filters({"hang"})
    stop = session.run()
    hang = stop.exception.evidence
    assert stop.exception.filter == "hang" and hang["node"] == "softmax_1"
    assert stop.instruction == hang["step"] and len(hang["waitFor"]) == 8
    assert all(w["waitsOn"] == "barrier 0" for w in hang["waitFor"])
    assert all(u.status in ("blocked", "halted", "idle") for u in session.unit_states())
    instruction(session, BACK)
    assert session.instruction == hang["lastProgress"]
    assert any(u.status in ("ready", "busy") for u in session.unit_states())


def test_a_write_to_local_memory_inside_a_node_is_undone_by_stepping_back(gpt):
    gpt.goto(node_named(gpt, "linear").index)
    for _ in range(150):
        instruction(gpt)
    tile = next(s for s in gpt.locate("layer_norm").shards if s.space == "SRAM")
    assert tile.bank is not None and tile.elements
    before = gpt.read_address(tile.address, 4)
    gpt.write_address(tile.address, np.float32(1234.5).tobytes())
    assert gpt.read_address(tile.address, 4) == np.float32(1234.5).tobytes()
    instruction(gpt, BACK)
    assert gpt.read_address(tile.address, 4) == before
    instruction(gpt)
    assert gpt.read_address(tile.address, 4) == np.float32(1234.5).tobytes()


def test_memory_a_node_does_not_use_cannot_be_written_inside_it(gpt):
    gpt.goto(node_named(gpt, "linear").index)
    instruction(gpt)
    with pytest.raises(RewindError, match="is not memory the node at tick"):
        gpt.write_address(gpt.tl.driver.plan.buffers["p_head_weight"].address, b"\0\0\0\0")


def test_the_torch_driver_answers_instruction_requests_with_a_clear_error():
    session = open_session(EXAMPLES / "mlp.py")
    with pytest.raises(RewindError, match="runs nodes, not instruction streams"):
        session.disassemble(1)
    assert session.step(granularity="instruction").tick == 1  # one node is its instruction
