"""`rewind forensics model.py --ranks N` (docs/ranks.md, "Forensics per rank"): the one-shot command runs every rank
of the program to its end in one gloo group and compares each rank with a float64 reference of the same ranks, in
words and as JSON; ranks whose collectives do not match are the problem it reports; what it cannot take is refused
in words before any rank starts."""

from __future__ import annotations

import json

import pytest

from dap_server import cli
from tests.conftest import MODELS, line_of

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite
MODEL = MODELS / "ranks" / "precision_on_one_rank.py"
BUG, CARRIES = (line_of(MODEL, marker) for marker in ("# BUG", "# CARRIES"))
HEADLINE = (f"rank 1 introduces the error at {MODEL.name}:{BUG} (`sum_1`); all_reduce #1 at {MODEL.name}:{CARRIES} "
            "carried it to rank 0")
SKIPPING = MODELS / "ranks" / "skipped_collective.py"
SKIPPED, GATHER = (line_of(SKIPPING, marker) for marker in ("# SKIPPED", "# GATHER"))


def forensics(capsys, *args: str) -> tuple[int, str, str]:
    """`rewind forensics ARGS` in this process: its exit status, what it printed and what it said on stderr."""
    status = cli.main(["forensics", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_report_names_the_rank_and_line_that_introduced_the_error_and_the_collective_that_carried_it(capsys):
    status, out, _ = forensics(capsys, MODEL, "--ranks", "2")
    assert status == 1
    assert f"Root cause: {HEADLINE}" in out and "(2 ranks, reference torch:cpu:float64)" in out
    rank0, rank1 = out.split("\nRank 0: ")[1].split("\nRank 1: ")
    assert rank0.startswith(f"first divergence at {MODEL.name}:{CARRIES}")
    assert f"carried in by all_reduce #1 at {MODEL.name}:{CARRIES} from rank 1 (its inputs: rank 0 'sum_1' within " \
           "tolerance; rank 1" in rank0
    assert rank1.startswith(f"first divergence at {MODEL.name}:{BUG}")
    assert "a node of rank 1's own introduced the error" in rank1 and "[low-precision-accumulation]" in rank1
    assert "fix: accumulate in float32" in rank1
    assert out.rstrip().endswith("Verdict: problem found")


def test_ranks_whose_collectives_do_not_match_are_the_problem_reported(capsys):
    status, out, _ = forensics(capsys, SKIPPING, "--ranks", "2", "--json")  # the JSON for agents
    report = json.loads(out, parse_constant=lambda c: pytest.fail(f"a {c} literal in the JSON"))
    assert status == 1 and report["problem"] and report["stop"]["reason"] == "exception"
    assert report["headline"] == (f"rank 0 calls all_reduce #2 (float32[4], sum) at skipped_collective.py:{SKIPPED}; "
                                  f"rank 1 calls all_gather_into_tensor #2 (float32[4]) at "
                                  f"skipped_collective.py:{GATHER}")
    assert report["ranks"] == [] and report["divergence"] is None
    assert "stopped before the end of the program" in report["divergenceReason"]


@pytest.mark.parametrize("args, words", [
    ((MODEL, "--ranks", "0"), "ranks is the number of processes of the torch.distributed program, a whole number "
                              "from 1 to 64; got 0"),
    ((MODEL, "--ranks", "65"), "a whole number from 1 to 64; got 65"),
    ((MODELS / "ranks" / "no_such_model.py", "--ranks", "2"), "program file not found: "),
    ((MODEL, "--ranks", "2", "--steps", "0"), "steps is the number of training steps, a whole number from 1"),
    ((MODEL, "--ranks", "2", "--html", "report.html", "--rtol", "0.1"),
     "--rtol, --html are not supported with --ranks yet"),
    ((MODEL, "--ranks", "2", "--reference", "saved.npz"), "--reference is not supported with --ranks yet")])
def test_what_a_pass_of_ranks_cannot_take_is_refused_in_words(capsys, tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)  # a report.html it wrongly wrote would be here
    status, out, err = forensics(capsys, *args)
    assert status == 2 and out == "" and words in err and "Error" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_number_of_ranks_that_is_no_number_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        forensics(capsys, MODEL, "--ranks", "two")
    assert exited.value.code == 2 and "--ranks: invalid int value: 'two'" in capsys.readouterr().err
