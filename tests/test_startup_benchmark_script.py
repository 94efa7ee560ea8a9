"""benchmarks/startup.py measures the issue's startup figures (benchmarks/RESULTS.md): it must not rot between runs.
Its quick mode end to end on the smallest example measures the floor, both debug launches and one whose engine an engine pool forked, checks that the
second launch loaded the program the first one cached, and that the console client imports no torch (figures are
not checked here: the machine is shared)."""

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = str(ROOT / "benchmarks" / "startup.py")


def test_the_startup_benchmark_measures_both_launches_and_the_cache_between_them():
    run = subprocess.run([sys.executable, SCRIPT, "--quick"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    table = run.stdout
    for row in ('| `python -c "import torch"` (the floor) | ',
                "| `rewind debug examples/mlp.py`, to its first stop and out, first (the cache empty: the export) | ",
                "| `rewind debug examples/mlp.py`, to its first stop and out, second (the program cache filled by",
                "| `rewind debug examples/mlp.py`, to its first stop and out, pooled (the cache filled, its engine forked",
                "| the engine pool's own start (`rewind pool`, once, before the launches) | ",
                "pool: each pooled launch's engine was forked by the pool (1 of 1)",
                "| torch not imported |",
                "| program cache | - | debug: the first run wrote 1 entry ("):
        assert row in table, f"{row!r} missing from\n{table}"
    assert "the second loaded it" in table and "forensics" not in table  # --quick leaves forensics out
