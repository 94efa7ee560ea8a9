"""Memory across runs: a relaunch frees the Timeline it replaces at once, and closing a Session gives back the values
its ring retained (a later read recomputes them), so the next run computes into memory already mapped."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from hardware.session import LaunchOptions
from tests.conftest import EXAMPLES, open_session, program

MLP = EXAMPLES / "mlp.py"


@pytest.mark.parametrize("check_batch", [1, 4], ids=["checks-at-once", "checks-in-batches"])
def test_a_relaunch_frees_the_timeline_it_replaces_and_its_write_log_without_the_garbage_collector(check_batch):
    session = open_session(MLP, check_batch=check_batch)
    session.run()
    replaced, its_log = weakref.ref(session.tl), weakref.ref(session.tl.log)
    gc.disable()  # what frees them is their references going, not a collection
    try:
        session.launch(LaunchOptions(str(MLP), driver="torch:cpu", check_batch=check_batch), program=program(str(MLP)))
        assert replaced() is None and its_log() is None
    finally:
        gc.enable()
    assert session.run().reason == "end"
    session.close()


def test_closing_a_session_gives_back_its_retained_values_and_a_later_read_recomputes_them_bit_for_bit():
    session = open_session(MLP)
    session.run()
    tl = session.tl
    positions = [1, tl.end // 2, tl.end]
    before = {(p, name): tl.value(name, p).clone() for p in positions for name in tl.live(p)}
    assert tl.ring.used > 0 and len(before) > len(positions)
    session.close()
    assert tl.ring.used == 0 and not tl.ring.keys() and not tl.store.frontier_values
    for (p, name), value in before.items():
        assert torch.equal(tl.value(name, p), value), f"'{name}' at tick {p} read back otherwise after the close"
    assert tl.recomputed > 0 and not tl.nondeterminism
