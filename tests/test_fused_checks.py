"""The CPU's checks of a write in one compiled pass (hardware/fused_checks.py) equal the torch operations'
(REWIND_CHECKS=torch) bit for bit, on every dtype a driver can hold, and on hostile tensors; where the kernel
cannot be built, the checks run as torch operations after one line saying why."""

from __future__ import annotations

import math
import struct
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware import fused_checks, tensor_checks
from hardware.driver import WriteStats
from hardware.drivers.torch import TorchDriver
from hardware.errors import RewindError
from tests.conftest import EXAMPLES, MODELS, open_session

DRIVER = TorchDriver.from_spec("torch:cpu")
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
        torch.uint64]


def bits(stats: WriteStats) -> tuple:
    """A WriteStats with every float as its bits: NaN equals NaN, -0.0 differs from 0.0."""
    return tuple(struct.pack("<d", v) if isinstance(v, float) else v for v in
                 (stats.digest, stats.nan, stats.inf, stats.min, stats.max, stats.mean))


def both(tensor: torch.Tensor) -> tuple[tuple, tuple]:
    """The driver's stats of `tensor` with the fused checks and with torch's."""
    try:
        tensor_checks.use_checks("fused")
        fused = DRIVER.inspect(tensor)
        tensor_checks.use_checks("torch")
        return bits(fused), bits(DRIVER.inspect(tensor))
    finally:
        tensor_checks.use_checks("fused")


@pytest.fixture(scope="module", autouse=True)
def kernel():
    built = fused_checks.kernel()
    assert built is not None, "the fused checks did not build on this machine (it has g++)"
    return built


def hostile(dtype: torch.dtype, n: int) -> torch.Tensor:
    """`n` elements of `dtype` with its extremes, zeros of both signs, subnormals, NaN and infinities."""
    gen = torch.Generator().manual_seed(n)
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        x = torch.randn(n, generator=gen, dtype=torch.float64) * 1e3
        special = [info.max, -info.max, info.tiny, info.smallest_normal / 4, -0.0, 0.0, math.nan, math.inf, -math.inf]
        for i, value in enumerate(special[: n // 3]):
            x[(i * 7) % n] = value
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool()
    info = torch.iinfo(dtype)
    x = torch.randint(-1000 if info.min < 0 else 0, 1000, (n,), generator=gen).to(dtype)
    if n > 2:
        x[0] = info.min
        if dtype == torch.uint64:
            x.view(torch.int64)[n - 1] = -1  # 2^64 - 1: torch takes no Python int that large
        else:
            x[n - 1] = info.max
    return x


SIZES = (1, 2, 7, 33, 1000, 8192 + 17)  # one element, the vectors' tails, the kernel's chunk boundary


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_fused_checks_equal_torch_checks_on_every_dtype(dtype):
    for n in SIZES:
        x = hostile(dtype, n)
        fused, reference = both(x)
        assert fused == reference, (dtype, n)
    full = hostile(dtype, 24).reshape(4, 6)  # views a driver may hand over: strided, transposed, broadcast
    for view in (full.t(), full[:, ::2], full[1:3], full[0:1].expand(5, 6), full[2, 3]):
        assert both(view)[0] == both(view)[1], (dtype, view.shape, view.stride())


def test_every_bit_pattern_of_the_narrow_floats_checks_alike():
    patterns = {torch.float16: torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16),
                torch.bfloat16: torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)}
    narrow = [(dtype, patterns[dtype].view(dtype)) for dtype in patterns]
    byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    narrow += [(dtype, byte.view(dtype)) for dtype in fused_checks.FLOAT8]
    assert len(narrow) >= 4  # float16, bfloat16 and float8 e4m3fn/e5m2 at least
    for dtype, x in narrow:
        fused, reference = both(x)
        assert fused == reference, dtype
        finite = x[torch.isfinite(x.double())]  # without NaN and infinities: the all-finite pass
        assert both(finite)[0] == both(finite)[1], dtype


def test_values_at_the_largest_float_have_a_mean_within_their_range():
    """The quantized sum of values at the largest float can round past it: the mean is still a float in [lo, hi]."""
    top = torch.finfo(torch.float64).max
    for values in ([1.7976931348623151e+308], [top, top], [-top], [top, 1.0e308, top]):
        x = torch.tensor(values, dtype=torch.float64)
        assert both(x)[0] == both(x)[1]
        stats = DRIVER.inspect(x)
        assert stats.min <= stats.mean <= stats.max and math.isfinite(stats.mean), (values, stats)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(FLOATS), st.lists(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
                                         min_size=1, max_size=70))
def test_any_floats_check_alike(dtype, values):
    x = torch.tensor(values, dtype=torch.float64).to(dtype)
    fused, reference = both(x)
    assert fused == reference


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=40))
def test_any_int64s_check_alike(values):
    fused, reference = both(torch.tensor(values, dtype=torch.int64))
    assert fused == reference


def test_the_mean_does_not_depend_on_the_order_of_the_elements_or_the_threads():
    x = torch.randn(300_000, dtype=torch.float64) * torch.logspace(-30, 30, 300_000, dtype=torch.float64)
    threads = torch.get_num_threads()
    try:
        seen = set()
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for how in tensor_checks.CHECKS:
                tensor_checks.use_checks(how)
                for order in (x, x.flip(0), x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(1))]):
                    seen.add(struct.pack("<d", DRIVER.inspect(order).mean))
    finally:
        torch.set_num_threads(threads)
        tensor_checks.use_checks("fused")
    assert len(seen) == 1
    assert math.isclose(struct.unpack("<d", seen.pop())[0], float(x.mean()), rel_tol=1e-9)


def test_extreme_magnitudes_keep_their_mean():
    """The quantised sum's scale reaches past a double for the smallest subnormals, and the largest doubles
    keep their terms within 2^50."""
    for values in ([5e-324, 1e-323, -5e-324], [1.7e308, 1.7e308, -1e308], [1e-310, 3.0], [2.0**-1074] * 9):
        x = torch.tensor(values, dtype=torch.float64)
        fused, reference = both(x)
        assert fused == reference
        stats = DRIVER.inspect(x)
        exact = float(sum(map(Fraction, values)) / len(values))
        assert math.isclose(stats.mean, exact, rel_tol=2**-52, abs_tol=max(map(abs, values)) * 2**-50 + 5e-324)


def test_a_session_records_the_same_stats_with_either_checks(monkeypatch):
    """Every write of a run, NaN and Inf included (late_flags.py), through the Session."""
    logs = {}
    for how in tensor_checks.CHECKS:
        monkeypatch.setenv(tensor_checks.CHECKS_VARIABLE, how)
        monkeypatch.setattr(tensor_checks, "_checks", [])  # read the variable again, as a new process does
        for path in (MODELS / "late_flags.py", EXAMPLES / "gpt.py"):
            session = open_session(path)
            session.tl.seek(session.tl.end)
            logs[how, path.name] = [(r.tick, r.value, bits(r.stats)) for r in session.tl.log]
    assert logs["fused", "late_flags.py"] == logs["torch", "late_flags.py"]
    assert logs["fused", "gpt.py"] == logs["torch", "gpt.py"]
    assert any(stats[1] for _, _, stats in logs["fused", "late_flags.py"])  # NaNs were counted


def test_dtypes_without_values_get_a_digest_and_no_stats():
    raw = torch.arange(16, dtype=torch.uint8)
    for dtype in (torch.bits8, torch.float4_e2m1fn_x2):
        stats = DRIVER.inspect(raw.view(dtype))
        assert stats.digest == DRIVER.inspect(raw).digest
        assert (stats.nan, stats.inf) == (0, 0) and math.isnan(stats.mean)
    assert DRIVER.inspect(torch.empty(0, 3)) == WriteStats.empty()
    z = torch.tensor([1 + 2j, math.nan + 0j, 3 - 4j])  # complex: by magnitude, with torch's operations
    assert (DRIVER.inspect(z).nan, DRIVER.inspect(z).max) == (1, 5.0)


def test_bad_checks_settings_are_named(monkeypatch):
    with pytest.raises(RewindError, match="not 'gpu'"):
        tensor_checks.use_checks("gpu")
    monkeypatch.setenv(tensor_checks.CHECKS_VARIABLE, "fast")
    monkeypatch.setattr(tensor_checks, "_checks", [])  # read the variable again, as a new process does
    with pytest.raises(RewindError, match="REWIND_CHECKS is 'fast': it is 'fused' .* or 'torch'"):
        DRIVER.inspect(torch.ones(3))


@pytest.mark.parametrize("compiler", ["missing", "broken"])
def test_without_a_working_compiler_the_checks_run_as_torch_operations(compiler, tmp_path, monkeypatch, capfd):
    fake = tmp_path / "bin" / "c++"
    if compiler == "broken":
        fake.parent.mkdir()
        fake.write_text("#!/bin/sh\necho 'fatal error: cannot write output' >&2\nexit 1\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(fused_checks, "_loaded", [])  # a new process: nothing built or loaded yet
    x = hostile(torch.float32, 100)
    tensor_checks.use_checks("torch")
    expected = bits(DRIVER.inspect(x))
    tensor_checks.use_checks("fused")
    assert bits(DRIVER.inspect(x)) == expected and bits(DRIVER.inspect(x)) == expected
    note = capfd.readouterr().err.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("rewind: the fused checks could not be built (")
    assert ("not on the PATH" if compiler == "missing" else "fatal error: cannot write output") in note[0]
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_two_builds_at_once_leave_one_kernel_and_a_damaged_one_is_built_again(tmp_path, monkeypatch):
    """Two builds racing (as two processes starting at once do: each compiles into a private file and renames it
    into place), then a cached kernel that no longer loads."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda _: fused_checks._built(), range(2)))
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert built[0] == built[1] and files == [built[0]]  # one kernel, no temporary left behind
    files[0].write_bytes(b"not a shared library")
    monkeypatch.setattr(fused_checks, "_loaded", [])  # a new process
    assert fused_checks.kernel() is not None and files[0].read_bytes().startswith(b"\x7fELF")
    x = hostile(torch.float64, 100)
    assert both(x)[0] == both(x)[1]
