"""Fast-forward (hardware/session/fast_forward.py): a motion runs the stretches where no stop can come keeping only
the write log and what the checkpoints need, and recomputes any other value when asked. The node-by-node run stays
the definition of behaviour: every write log row, every stop and every value read afterwards is the same, bit for
bit, with fast-forward and without it, on the engine's model, a training run and a run of many ranks."""

from __future__ import annotations

import random

import pytest
import torch

from hardware.ranks.coordinator import Coordinator
from hardware.session import Direction, LaunchOptions, LineSpec, Session
from tests.conftest import EXAMPLES, MODELS, line_of
from tests.test_training_session import training

GPT = EXAMPLES / "gpt.py"
ADDRESS = 6  # a write log row's address: where the allocator put the tensor, which no run promises to repeat
TENSOR_PARALLEL = EXAMPLES / "tensor_parallel.py"
LATE_NAN = MODELS / "training" / "session_late_nan.py"


def rows(session: Session) -> list[list]:
    log = session.tl.log
    return [[repr(field) for i, field in enumerate(log.row(r)) if i != ADDRESS] for r in range(len(log))]  # nan == nan


def launched(fast: bool | None, path=GPT, **options) -> Session:
    session = Session(None)
    chosen = {} if fast is None else {"fast_forward": fast}
    session.launch(LaunchOptions(str(path), driver="torch:cpu", stop_on_entry=True, **chosen, **options))
    session.start()
    return session


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).contiguous().view(torch.uint8)  # bit for bit: a NaN equals its own bits


def same_values_everywhere(fast: Session, slow: Session, ticks: list[int]) -> int:
    """Go to each tick in both sessions and compare every live value's bytes; returns the values compared."""
    compared = 0
    for tick in ticks:
        fast.goto(tick)
        slow.goto(tick)
        live = slow.tl.live()
        assert fast.tl.live() == live
        for name in live:
            a, b = fast.tl.value(name), slow.tl.value(name)
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(_bytes(a), _bytes(b)), (tick, name)
            compared += 1
    return compared


@pytest.fixture(scope="module")
def gpt_pair():
    pair = launched(True), launched(False)
    yield pair
    for s in pair:
        s.close()


def test_a_continue_to_the_end_writes_the_same_log_and_values_as_node_by_node(gpt_pair):
    fast, slow = gpt_pair
    assert fast.run().reason == slow.run().reason == "end"
    assert rows(fast) == rows(slow)
    assert fast.tl.recomputed == 0  # nothing was asked for yet
    ticks = random.Random(0).sample(range(fast.tl.end + 1), 24) + [0, fast.tl.end]
    assert same_values_everywhere(fast, slow, ticks) > 50
    assert fast.tl.recomputed > 0  # the values it did not keep were made again, from its checkpoints
    assert rows(fast) == rows(slow)  # recomputing checked each digest against the log: nothing was non-deterministic
    assert not fast.tl.nondeterminism


def test_fast_forward_keeps_fewer_values_and_checkpoints_at_the_same_ticks():
    fast, slow = launched(True), launched(False)
    try:
        fast.run()
        slow.run()
        assert [c.tick for c in fast.tl.checkpoints()] == [c.tick for c in slow.tl.checkpoints()]
        assert 0 < fast.tl.ring.used < slow.tl.ring.used / 2
    finally:
        fast.close()
        slow.close()


def test_breakpoints_stop_at_the_same_ticks_in_both_directions_and_each_stretch_stops_before_them():
    line = line_of(GPT, "x = x + self.attn(self.ln1(x))")
    fast, slow = launched(True), launched(False)
    try:
        stops = {}
        for s in (fast, slow):
            s.set_line_breakpoints(str(GPT), [LineSpec(line)])
            forward = [s.run().tick for _ in range(3)]
            backward = [s.run(Direction.REVERSE).tick for _ in range(2)]
            stops[s is fast] = (forward, backward, s.tl.frontier)
        assert stops[True] == stops[False]
        assert stops[True][2] == stops[True][0][-1]  # the last stretch ran to the breakpoint, not past it
        assert rows(fast) == rows(slow)
    finally:
        fast.close()
        slow.close()


def test_a_nan_found_by_the_fused_records_stops_at_its_write_as_node_by_node():
    path = MODELS / "planted_nan.py"
    fast, slow = launched(True, path), launched(False, path)
    try:
        for s in (fast, slow):
            s.set_exception_filters(["nan"])
        a, b = fast.run(), slow.run()
        assert (a.reason, a.tick, a.description) == (b.reason, b.tick, b.description) and a.reason == "exception"
        assert fast.tl.frontier == slow.tl.frontier == a.tick  # the stretch past the NaN is forgotten
        assert same_values_everywhere(fast, slow, [a.tick, a.tick - 1, 0]) > 0
    finally:
        fast.close()
        slow.close()


def test_a_training_run_fast_forwarded_updates_the_same_parameters_bit_for_bit():
    program = training(LATE_NAN, 3)
    pair = []
    for fast in (True, False):
        s = Session(None)
        s.launch(LaunchOptions(str(LATE_NAN), entry="train_step", steps=3, driver="torch:cpu", stop_on_entry=True,
                               fast_forward=fast), program=program)
        s.start()
        pair.append(s)
    fast, slow = pair
    try:
        assert fast.run().reason == slow.run().reason
        fast.set_exception_filters([])
        slow.set_exception_filters([])
        fast.run()
        slow.run()
        assert rows(fast) == rows(slow)
        starts = [fast.state.step_start(k) for k in range(3)] + [fast.tl.end]
        assert same_values_everywhere(fast, slow, starts + [starts[1] + 5, starts[2] - 3]) > 10
        for name in slow.program.buffer_mutations.values():  # the parameters' memory as each step left it
            fast.goto(fast.tl.end)
            slow.goto(slow.tl.end)
            assert torch.equal(_bytes(fast.tl.store.physical[name]), _bytes(slow.tl.store.physical[name])), name
    finally:
        fast.close()
        slow.close()


def test_a_launch_fast_forwards_only_when_it_asks():
    plain, asked = launched(None), launched(True)
    try:
        assert asked.tl.fast_forward and not plain.tl.fast_forward
    finally:
        plain.close()
        asked.close()


def test_ranks_fast_forwarded_reach_the_same_values_as_ranks_run_node_by_node(launcher):
    with Coordinator(str(TENSOR_PARALLEL), 2, timeout_s=120, launcher=launcher, ring={"fast_forward": True}) as fast, \
            Coordinator(str(TENSOR_PARALLEL), 2, timeout_s=120, launcher=launcher,
                        ring={"fast_forward": False}) as slow:
        assert fast.run().reason == slow.run().reason == "end"
        for tick in (None, 3, 1):
            if tick is not None:
                fast.goto(tick)
                slow.goto(tick)
            for rank in range(2):
                values = slow.values(rank)
                assert fast.values(rank) == values
                for name in values:
                    assert fast.tensor(rank, name)["bytes"] == slow.tensor(rank, name)["bytes"], (rank, tick, name)
