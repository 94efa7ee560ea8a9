"""On-device checks read back in batches: the flag stops the run at the tick that set it, the write log is
complete once the batches land, and a rewritten future drops the checks still on their way."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from checkpoint.timeline import Timeline
from hardware.drivers.torch import TorchDriver
from hardware.errors import RewindError
from hardware.session import Direction, LaunchOptions, Session
from tests.conftest import EXAMPLES, program

LATE_FLAGS = Path(__file__).resolve().parent / "models" / "late_flags.py"
NAN_TICK, INF_TICK = 5, 14  # sqrt of negatives, exp that overflows (see the model)


def _session(path: Path, **options) -> Session:
    session = Session()
    session.launch(LaunchOptions(str(path), driver="torch:cpu", **options), program=program(str(path)))
    session.set_exception_filters(["nan", "inf"])
    return session


def _timeline(path: Path, batch: int | None) -> Timeline:
    return Timeline(program(str(path)), TorchDriver.from_spec("torch:cpu"), budget=64 << 20, check_batch=batch)


def _stats(tl: Timeline) -> list[tuple]:
    """Every record's digest and stats, NaN made comparable."""
    def same(v: float) -> float | str:
        return "nan" if math.isnan(v) else v
    return [(r.tick, r.value, r.digest, r.stats.nan, r.stats.inf, same(r.stats.min), same(r.stats.max),
             same(r.stats.mean)) for r in tl.log]


def test_a_flag_seen_batches_later_stops_at_the_tick_that_set_it():
    immediate, batched = _session(LATE_FLAGS), _session(LATE_FLAGS, check_batch=4)
    for tick, kind in ((NAN_TICK, "nan"), (INF_TICK, "inf")):
        now, late = immediate.run(), batched.run()
        assert (now.reason, now.tick, now.exception.filter) == ("exception", tick + 1, kind)
        assert (late.reason, late.tick, late.exception.filter) == (now.reason, now.tick, now.exception.filter)
        assert late.exception.value == now.exception.value and late.exception.count == now.exception.count
        assert immediate.tl.frontier == tick + 1 < batched.tl.frontier  # the batch landed ticks later
    assert batched.run().reason == immediate.run().reason == "end"
    back = batched.run(Direction.REVERSE)
    assert (back.reason, back.tick) == ("exception", INF_TICK + 1)


def test_the_write_log_is_complete_after_the_batches_land():
    for path in (LATE_FLAGS, EXAMPLES / "gpt.py"):
        immediate, batched = _timeline(path, None), _timeline(path, 8)
        immediate.seek(immediate.end)
        batched.seek(batched.end)
        assert batched.checks.holds()  # the last batch is still open
        batched.checks.settle()
        assert not batched.checks.holds()
        assert _stats(batched) == _stats(immediate)


def test_reading_a_pending_record_waits_for_its_batch():
    immediate, batched = _timeline(LATE_FLAGS, None), _timeline(LATE_FLAGS, 64)
    immediate.seek(NAN_TICK + 1)
    batched.seek(NAN_TICK + 1)
    rec = batched.log.at_tick(NAN_TICK)[0]
    assert rec.stats.nan == immediate.log.at_tick(NAN_TICK)[0].stats.nan > 0
    assert not batched.checks.holds()


def test_batching_reads_the_checks_back_once_per_batch():
    batched = _timeline(EXAMPLES / "gpt.py", 8)
    batched.seek(batched.end)
    batched.checks.settle()
    checked = sum(1 for r in batched.log if r.kind != "view")
    assert batched.checks.readbacks == math.ceil(checked / 8) < checked


def test_a_run_that_asks_for_no_stats_lets_go_of_each_batch_that_landed():
    """Without exception filters nothing asks for a write's stats during a run: a batch that has landed when the
    next one is sent fills its rows and lets go of the tensors it held, so on a GPU the outputs the pool copied go
    back to the allocator during the run rather than after it."""
    tl = _timeline(EXAMPLES / "gpt.py", 4)
    tl.seek(tl.end)
    held = [row for row in range(len(tl.log)) if tl.checks.holds(row)]
    assert tl.checks.readbacks > 2 and 0 < len(held) <= 2 * 4  # the last batch sent and the one still open


def test_a_rewritten_future_drops_the_checks_still_on_their_way():
    edited = []
    for batch in (None, 4):
        tl = _timeline(LATE_FLAGS, batch)
        tl.seek(10)  # with batches of 4, the writes of ticks 8 and 9 are still open
        tl.seek(9)
        tl.edit("mul_3", 0, bytes(4), "zero one element")
        tl.seek(tl.end)
        if tl.checks is not None:
            assert tl.checks.holds()
        edited.append(_stats(tl))
    assert edited[0] == edited[1]


def test_a_write_holding_nan_and_inf_is_described_by_its_finite_elements():
    driver = TorchDriver.from_spec("torch:cpu")
    x = torch.tensor([2.0, math.nan, -math.inf, -1.5, math.inf, math.nan, 4.0])
    finite = x[torch.isfinite(x)]
    got = driver.inspect(x)
    assert (got.nan, got.inf) == (2, 2)
    assert (got.min, got.max, got.mean) == (float(finite.min()), float(finite.max()), float(finite.mean()))
    none_finite = driver.inspect(torch.tensor([math.inf, math.nan, -math.inf]))
    assert (none_finite.nan, none_finite.inf) == (1, 2) and all(map(math.isnan, (none_finite.min, none_finite.mean)))


def test_a_batch_of_no_writes_is_refused():
    with pytest.raises(RewindError, match="at least one write, not 0"):
        _timeline(LATE_FLAGS, 0)
