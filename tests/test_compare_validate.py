"""`rewind validate --function NAME CANDIDATE --against REF`: the generated coverage suite (tails, sizes 1, block,
block + 1, dtypes, scales x0.125 .. x8, special values); a fix passes every case, a planted bug fails the cases it
should, a wrapper of the reference's operator is refused before anything runs."""

import json
from pathlib import Path

import pytest

from dap_server.cli import main

HERE = Path(__file__).parent / "models" / "candidates"
REF = str(HERE / "reference.py")
SUITE = {"example", "dtype float64", "dtype float16", "dtype bfloat16", "scale x0.125", "scale x8", "zeros",
         "large negatives", "NaN in the last input", "infinity in the last input"}


def validate(capsys, file: str, function: str, against: str) -> tuple[int, dict]:
    code = main(["validate", "--function", function, str(HERE / file), "--against", f"{REF}:{against}", "--json"])
    out, err = capsys.readouterr()
    assert code != 2, err
    return code, json.loads(out)


def cases(report: dict) -> dict[str, dict]:
    return {c["case"]: c for c in report["cases"]}


FIXES = [("blocked_attention_fixed.py", "blocked_attention", "sdpa_attention"),
         ("layer_norm_fixed.py", "layer_norm", "layer_norm")]


@pytest.mark.parametrize("file, function, against", FIXES)
def test_a_fix_passes_every_case_of_the_suite(capsys, file, function, against):
    code, report = validate(capsys, file, function, against)
    assert code == 0 and report["verdict"] == "validated", report["reason"]
    assert SUITE <= set(cases(report)) and report["failed"] == 0
    assert all(c["passed"] for c in report["cases"])


def test_the_blocked_kernel_is_sized_at_its_block_and_around_it(capsys):
    code, report = validate(capsys, "tail_block_fixed.py", "tail_attention", "sdpa_attention")
    assert code == 0, report["reason"]
    sizes = [name for name in cases(report) if name.startswith("size ") and "k dim 0" in name]
    assert [s.split()[1] for s in sizes] == ["1", "16", "17", "40"]  # 1, the block, the block + 1, a tail


def test_the_dropped_tail_fails_the_sizes_that_are_not_a_multiple_of_the_block(capsys):
    code, report = validate(capsys, "tail_block.py", "tail_attention", "sdpa_attention")
    by_name = cases(report)
    assert code == 1 and report["verdict"] == "rejected"
    failed = {n for n, c in by_name.items() if not c["passed"]}
    assert {"size 17 for k dim 0, v dim 0", "size 40 for k dim 0, v dim 0"} <= failed
    assert by_name["size 16 for k dim 0, v dim 0"]["passed"]


def test_the_unrescaled_accumulator_is_rejected_with_each_failing_case(capsys):
    code, report = validate(capsys, "blocked_attention.py", "blocked_attention", "sdpa_attention")
    by_name = cases(report)
    assert code == 1 and report["failed"] > 0
    assert not by_name["example"]["passed"] and "beyond tolerance" in by_name["example"]["reason"]
    assert by_name["size 16 for q dim 0, k dim 0, v dim 0"]["passed"]  # one block: no rescale


def test_the_wrong_axis_is_rejected(capsys):
    code, report = validate(capsys, "layer_norm.py", "layer_norm", "layer_norm")
    assert code == 1 and report["verdict"] == "rejected" and not cases(report)["example"]["passed"]


def test_a_wrapper_is_refused_before_any_case_runs(capsys):
    code, report = validate(capsys, "wrapper_attention.py", "tiled_attention", "sdpa_attention")
    assert code == 1 and report["verdict"] == "refused" and report["cases"] == []
    assert "wrapper-assisted, not a kernel" in report["reason"]
