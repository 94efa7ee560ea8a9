"""benchmarks/ranks.py measures the issue's figures (2 and 4 ranks, several launches): it must not rot between its
runs. The script end to end with --small (2 ranks, one launch each) prints every row, side by side with plain
torch.distributed (the tensor-parallel and pipeline examples, the data-parallel step, the planted mismatch and
p2p deadlock); a bad option is refused in words."""

import subprocess
import sys

import pytest

from benchmarks.ranks import main
from tests.conftest import ROOT

SCRIPT = str(ROOT / "benchmarks" / "ranks.py")
ROWS = ("| model | examples/tensor_parallel.py: 12 nodes, 2 all_reduce per rank |",
        "| first launch: the rank launcher's start, then the ranks |",
        "| launch: ranks forked, each exporting its program (median of the others) |",
        "| eager forward, plain torch.distributed (slowest rank, median) |",
        "| Rewind: run to the end (first execution, consistent cuts) |", "| overhead per node |",
        "| one-node step of every rank, p50 |", "| one-node step across a collective, p50 |",
        "| overhead per collective (the difference) |", "| step back across a collective, p50 / p95 |",
        "| data-parallel training step, plain torch.distributed (slowest rank, median) |",
        "| Rewind: the training step to the end |", "| the same with the replicas check on every parameter |",
        "| planted skipped collective: entry to the stop (median) |",
        "| the same program, plain torch.distributed | hangs (until gloo's timeout) |",
        "| pipeline model | examples/pipeline_parallel.py: 13-15 nodes a rank, 2 send/recv pairs, 1 all_reduce |",
        "| pipeline: eager forward, plain torch.distributed (slowest rank, median) |",
        "| pipeline: Rewind run to the end |", "| pipeline: one-node step of every rank, p50 |",
        "| pipeline: one-node step across send/recv pairs, p50 |",
        "| overhead per send/recv pair (the difference, per pair crossed, p50) |",
        "| step back across a send/recv (a rank one node back across its recv), p50 / p95 |",
        "| planted p2p deadlock (both ranks send first): entry to the stop (median) |",
        "| the same program, plain torch.distributed on gloo (median) | runs through: ")


def test_the_ranks_benchmark_prints_every_row_for_two_ranks():
    run = subprocess.run([sys.executable, SCRIPT, "--small"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| measure | 2 ranks |" in run.stdout
    for row in ROWS:
        assert row in run.stdout, f"{row!r} missing from\n{run.stdout}"


def test_the_ranks_benchmark_refuses_a_count_below_one(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--repeats", "0"])
    assert ended.value.code == 2
    assert "--repeats is a number of times, at least 1" in capsys.readouterr().err
