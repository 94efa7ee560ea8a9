"""benchmarks/gpu.py gets one run on a GPU when a session has one: it must not rot between them. The same
script end to end on the CPU, with a small model, measures every row (figures are not checked here)."""

import subprocess
import sys

from tests.conftest import ROOT


def test_the_gpu_benchmark_measures_every_row_on_the_cpu_with_a_small_model(tmp_path):
    out = tmp_path / "gpu.md"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--small",
                          "--repeats", "1", "--samples", "3", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    table = out.read_text()
    assert "FAILED" not in table, table
    for row in ("eager forward", "continuous checkpointing, device tier", "by reference, checks at once",
                "budget 25% of intermediates", "step back at random ticks", "restore at 75% + replay",
                "check cost: digest", "replay digest check, last quarter | 0 mismatches",
                "host time per node: session, device tier", "determinism", "whole benchmark"):
        assert row in table, row
