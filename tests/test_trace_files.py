"""Traces: save a run, open it with no device, get the same answers; damaged files fail clearly."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint.recording import open_trace as rebuild
from checkpoint.timeline import Timeline
from checkpoint.trace import TraceError, TraceReader, adopt_partial
from hardware.drivers import trace_driver
from hardware.errors import RewindError
from hardware.session import Direction, LaunchOptions, LineSpec, Session
from tests.conftest import EXAMPLES, MODELS, ROOT, line_of, open_session
from tests.test_trace_trust import assert_clear, assert_refused_or_usable, boundaries


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    live = open_session(EXAMPLES / "gpt.py", budget_mb=0.05)
    live.run()
    path = tmp_path_factory.mktemp("trace") / "gpt.rwtrace"
    info = live.save_trace(str(path))
    return live, path, info


def open_trace(path, **kw) -> Session:
    session = Session()
    session.launch(LaunchOptions(trace=str(path), budget_mb=kw.pop("budget_mb", 0.05), **kw))
    return session


def test_opened_trace_answers_like_the_live_session(saved):
    live, path, info = saved
    assert info["ticks"] == live.end and info["bytes"] > 0
    trace = open_trace(path)
    assert trace.end == live.end and trace.tl.frontier == live.end
    for tick in (0, 7, 23, live.end // 2, live.end):
        trace.goto(tick)
        live.goto(tick)
        assert sorted(trace.live_values()) == sorted(live.live_values())
        for name in trace.live_values():
            assert torch.equal(trace.tensor(name), live.tensor(name)), (tick, name)
            assert trace.value_stats(name) == live.value_stats(name)
        if tick < live.end:
            assert trace.frames() == live.frames()


def test_a_scalar_value_is_recorded_and_read_back(tmp_path):
    path = tmp_path / "scalar.rwtrace"
    live = open_session(MODELS / "bf16_double.py", record=str(path))  # its output is a 0-d sum
    live.run()
    live.close()
    trace = open_trace(path)
    trace.goto(trace.end)
    assert trace.tensor("sum_1").shape == () and torch.equal(trace.tensor("sum_1"), live.tensor("sum_1"))


def test_a_program_whose_op_is_a_dunder_is_recorded_and_opened(tmp_path):
    """`(x > 0) & (x < 1)` exports as aten.__and__.Tensor: an operator too, though its name is a dunder."""
    model = tmp_path / "masked.py"
    model.write_text("import torch\nfrom torch import nn\n\n\nclass Masked(nn.Module):\n    def forward(self, x):\n"
                     "        return x * ((x > 0) & (x < 1))\n\n\ndef build():\n    return Masked(), (torch.randn(8),)\n")
    path = tmp_path / "masked.rwtrace"
    live = open_session(model, record=str(path))
    live.run()
    live.close()
    trace = open_trace(path)
    assert "aten.__and__.Tensor" in {n.op for n in trace.program.nodes}
    trace.goto(trace.end)
    assert torch.equal(trace.tensor(live.program.outputs[0]), live.tensor(live.program.outputs[0]))


def test_breakpoints_and_reverse_execution_work_from_the_trace(saved):
    live, path, _ = saved
    trace = open_trace(path)
    file = str(EXAMPLES / "gpt.py")
    masked = line_of(EXAMPLES / "gpt.py", "scores = scores.masked_fill")  # in both blocks' attention
    trace.set_line_breakpoints(file, [LineSpec(masked, condition="scores.max() > 0")])
    live.set_line_breakpoints(file, [LineSpec(masked, condition="scores.max() > 0")])
    live.goto(0)
    assert trace.start().tick == live.start().tick
    assert trace.run().tick == live.run().tick
    assert trace.run(Direction.REVERSE).tick == live.run(Direction.REVERSE).tick
    trace.step(Direction.REVERSE, "statement")
    live.step(Direction.REVERSE, "statement")
    assert trace.position == live.position


def test_provenance_and_locations_come_from_the_recording(saved):
    live, path, _ = saved
    trace = open_trace(path)
    trace.goto(trace.end)
    live.goto(live.end)
    assert trace.provenance("softmax_1") == live.provenance("softmax_1")
    recorded = live.tl.log.last_writer(value="softmax_1").location
    assert trace.locate("softmax_1").shards[0].address == recorded.address
    assert trace.locate("p_head_weight").shards[0].address == live.locate("p_head_weight").shards[0].address


def test_a_value_missing_from_the_trace_says_a_driver_is_needed(tmp_path):
    live = open_session(EXAMPLES / "mlp.py")
    live.run()
    path = tmp_path / "mlp.rwtrace"
    live.save_trace(str(path))
    _, tl, _ = rebuild(str(path), lambda program, driver, archive: Timeline(program, driver, budget=2**20,
                                                                             archive=archive), trace_driver)
    tl.archive.reader.contents.versions.clear()  # as if the trace held no computed value
    tl.seek(tl.end)
    with pytest.raises(RewindError, match="needs the device that recorded it"):
        tl.value("relu")
    session = Session()
    session.launch(LaunchOptions(trace=str(path), driver="torch:cpu", budget_mb=1))
    session.tl.archive.reader.contents.versions.clear()
    session.goto(session.end)
    assert torch.equal(session.tensor("linear_2"), live.tensor("linear_2"))


def test_continuous_recording_survives_a_killed_server(tmp_path):
    path = tmp_path / "killed.rwtrace"
    script = (
        "import sys, time; sys.path.insert(0, {root!r})\n"
        "from hardware.session import Session, LaunchOptions, Direction\n"
        "s = Session(); s.launch(LaunchOptions({model!r}, driver='torch:cpu', record={path!r}))\n"
        "for i in range(10**6):\n"
        "    s.step(Direction.FORWARD, 'instruction')\n"
        "    if i == 10: print('stepped', flush=True)\n"
        "    time.sleep(0.02)\n"
    ).format(root=str(ROOT), model=str(MODELS / "slow_mlp.py"), path=str(path))
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "stepped"
    time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial, = tmp_path.glob(".killed.rwtrace.*.partial")  # a recording is written beside its file until closed
    adopt_partial(partial, path)
    events = []
    session = Session(events.append)
    session.launch(LaunchOptions(trace=str(path), budget_mb=1))
    ran = session.tl.frontier
    assert 0 < ran < session.end
    warnings = [e.text for e in events if e.kind == "output"]
    assert any("did not finish" in w or "interrupted" in w for w in warnings)
    session.goto(ran)
    live = open_session(MODELS / "slow_mlp.py")
    live.goto(ran)
    for name in session.live_values():
        assert torch.equal(session.tensor(name), live.tensor(name))
    with pytest.raises(RewindError, match="needs the device"):
        session.step(Direction.FORWARD, "instruction")
        session.tensor(session.tl.node_at(ran).outputs[0])


def corrupt(path: Path, tmp_path: Path, edit) -> Path:
    data = bytearray(path.read_bytes())
    out = tmp_path / "bad.rwtrace"
    out.write_bytes(bytes(edit(data)))
    return out


def test_not_a_trace_wrong_version_bit_flip_and_truncation_name_the_problem(saved, tmp_path):
    _, path, _ = saved
    with pytest.raises(TraceError, match="not a Rewind trace"):
        TraceReader(corrupt(path, tmp_path, lambda d: b"hello world, not a trace at all"))
    with pytest.raises(TraceError, match="trace file not found"):
        TraceReader(tmp_path / "missing.rwtrace")

    def version_99(d):
        d[8:12] = (99).to_bytes(4, "little")
        return d
    with pytest.raises(TraceError, match="format version 99"):
        TraceReader(corrupt(path, tmp_path, version_99))

    def flip(d):
        d[200] ^= 0x10
        return d
    with pytest.raises(TraceError, match=r"offset \d+"):
        TraceReader(corrupt(path, tmp_path, flip))
    versions = sorted(TraceReader(path).contents.versions.values())
    cut = TraceReader(corrupt(path, tmp_path, lambda d: d[: versions[len(versions) // 2] + 5]))  # amid the steps
    assert any("incomplete frame at offset" in w for w in cut.contents.warnings)
    with pytest.raises(TraceError, match=r"cut short .* before the initial values of 'p_"):  # amid the parameters
        TraceReader(corrupt(path, tmp_path, lambda d: d[: len(d) // 2]))
    with pytest.raises(TraceError, match="no program frame"):
        TraceReader(corrupt(path, tmp_path, lambda d: d[:16]))


# Where damage lands: a frame of one of these kinds, from its first byte to 64 bytes in. Hypothesis draws the first
# ones most (what it deems simplest): damage amid the steps, which a reader may open cut short; the header, the
# program and the parameters, which it must refuse, come up too.
REGIONS = ("version", "step", "write", "checkpoint", "index", "footer", "initial", "program", "meta", "header")


def _damaged_copy(data, original: bytes) -> bytes:
    """`original` with 1 to 8 flips, splices and cuts."""
    starts: dict[str, list[int]] = {"header": [0]}
    for offset, kind in boundaries(original):
        starts.setdefault(kind, []).append(offset)
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["late cut", "flip", "splice", "cut"]))
        frames = starts[data.draw(st.sampled_from(REGIONS))]
        at = min(len(damaged), frames[data.draw(st.integers(0, len(frames) - 1))] + data.draw(st.integers(0, 64)))
        if kind == "flip" and at < len(damaged):
            damaged[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "splice":
            damaged[at:at] = data.draw(st.binary(min_size=1, max_size=64))
        elif kind == "cut":
            damaged = damaged[:at]
        elif kind == "late cut":  # amid the steps, after the parameters: a trace that opens cut short
            damaged = damaged[: data.draw(st.integers(len(damaged) * 9 // 10, len(damaged)))]
    return bytes(damaged)


def test_reader_never_crashes_or_hangs_on_damaged_files(saved, tmp_path):
    """Hypothesis's damage to a trace of examples/gpt.py, opened through `Session` (LaunchOptions(trace=...)).

    Each damaged file is either refused, with the project's own error (a RewindError naming the file, in words: no
    Python exception names, no traceback) and the same Session then opens the undamaged trace and answers like the
    live run; or it opens, and every value it shows at tick 0, half way, at its frontier and past it is bit for bit
    the live run's (frames carry checksums: damage may cost values, never change them), or is refused in words;
    then the rule of tests/test_trace_trust.py (`assert_refused_or_usable`: every motion and request works or fails
    in words) holds for it. Both outcomes must occur. The same files through DAP: tests/dap/test_damaged_traces.py."""
    live, path, _ = saved
    original = path.read_bytes()
    run = open_session(EXAMPLES / "gpt.py")  # the live run again, every value kept: the expected values
    recorded: dict[int, dict] = {}

    def reference(tick: int) -> dict:
        """The live run's values at `tick`: name -> (tensor, stats)."""
        if tick not in recorded:
            run.goto(tick)
            recorded[tick] = {n: (run.tensor(n).clone(), run.value_stats(n)) for n in run.live_values()}
        return recorded[tick]

    def agrees(session: Session, tick: int) -> int:
        """Go to `tick` and read every value; what reads must be the live run's. How many values read."""
        try:
            session.goto(tick)
        except RewindError as exc:
            assert_clear(str(exc))
            return 0
        expected = reference(tick)
        assert sorted(session.live_values()) == sorted(expected), tick
        read = 0
        for name, (tensor, stats) in expected.items():
            try:
                got = session.tensor(name)
            except RewindError as exc:
                assert_clear(str(exc))
                continue
            assert torch.equal(got, tensor), (tick, name)
            assert session.value_stats(name) == stats, (tick, name)
            read += 1
        return read

    outcomes = {"opened": 0, "refused": 0, "values read from opened files": 0}

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def damaged_file(data):
        bad = tmp_path / "fuzz.rwtrace"
        bad.write_bytes(_damaged_copy(data, original))
        started = time.monotonic()
        session = Session()
        try:
            session.launch(LaunchOptions(trace=str(bad), budget_mb=0.05))
        except RewindError as exc:
            outcomes["refused"] += 1
            message = str(exc)
            assert str(bad) in message, f"the refusal does not name the file: {message}"
            assert_clear(message)
            session.launch(LaunchOptions(trace=str(path), budget_mb=0.05))  # the same Session, the whole trace
            assert session.tl.frontier == session.end == live.end
            assert agrees(session, live.end) == len(reference(live.end)) > 0
            session.close()
            assert time.monotonic() - started < 60
            return
        outcomes["opened"] += 1
        frontier = session.tl.frontier
        assert session.end == live.end and 0 <= frontier <= live.end
        for tick in sorted({0, frontier // 2, frontier, min(frontier + 1, live.end), live.end}):
            outcomes["values read from opened files"] += agrees(session, tick)
        session.close()
        assert_refused_or_usable(bad)
        assert time.monotonic() - started < 60

    damaged_file()
    assert outcomes["opened"] >= 5 and outcomes["refused"] >= 5, outcomes  # both sides of the rule were exercised
    assert outcomes["values read from opened files"] >= 10 * outcomes["opened"], outcomes  # and compared


def test_ring_spills_to_host_and_disk_tiers_within_their_budgets(tmp_path):
    full = open_session(MODELS / "deep_gpt.py", budget_mb=64)
    full.run()
    total = full.tl.ring.used
    session = Session()
    session.launch(LaunchOptions(str(MODELS / "deep_gpt.py"), driver="torch:cpu", budget_mb=total / 8 / 2**20,
                                 every=3, host_mb=total / 6 / 2**20, disk_mb=total / 2**20, spill_dir=str(tmp_path)))
    tl = session.tl
    session.run()
    tiers = tl.tiers
    assert tl.ring.peak <= tl.ring.budget
    assert 0 < tiers.used <= tiers.budget and 0 < tiers.below.used <= tiers.below.budget
    labels = {c["tier"] for c in session.checkpoints()}
    assert {"host (lz4)", "disk"} & labels
    for tick in (5, 1, tl.end // 2):
        session.goto(tick)
        full.goto(tick)
        for name in session.live_values():
            assert torch.equal(session.tensor(name), full.tensor(name))
    assert tl.nondeterminism == []
    session.close()
    assert not os.path.exists(tiers.below.path)
