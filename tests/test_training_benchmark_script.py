"""benchmarks/training.py measures the issue's figures in runs of many minutes: it must not rot between them. The
script end to end on a tiny configuration measures every row (figures are not checked here, but that the loop, the
eager rerun and the relaunch agree on the loss curve is); a bad option is refused in words."""

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = str(ROOT / "benchmarks" / "training.py")


def test_the_training_benchmark_measures_every_row_on_a_tiny_configuration():
    run = subprocess.run([sys.executable, SCRIPT, "--small", "--steps", "2", "--patch-step", "1",
                          "--overhead-steps", "1", "--repeats", "1", "--samples", "2"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    table = run.stdout
    for row in ("| model | examples/train_gpt.py", "| export (one-time) |",
                "| examples/train_gpt.py: debuggable step, every write checkpointable |",
                "| examples/train_gpt.py: optimizer | Session's optimizer nodes",
                "| examples/train_gpt.py: the host between nodes |", "| 2 steps: run |",
                "| step-start checkpoints | 2 of 2 step starts", "| step back at random ticks, one node |",
                "| step back at random ticks, one node, then every live value read |",
                "| experiment loop: lr from step 1 of 2 |", "| fresh process: eager training with the change |",
                "| fresh process: Rewind relaunched with the change |",
                "| loss curves | loop, eager rerun and relaunch the same, bit for bit"):
        assert row in table, f"{row!r} missing from\n{table}"
    assert "width 256" not in table  # --small leaves the wider model out


def test_the_training_benchmark_refuses_a_patch_step_outside_the_run():
    run = subprocess.run([sys.executable, SCRIPT, "--small", "--steps", "3", "--patch-step", "3"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "a patch step from 1 to steps - 1" in run.stderr and "Traceback" not in run.stderr
