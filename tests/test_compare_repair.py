"""`rewind repair --function NAME CANDIDATE --against REF --fix FILE`: the repair loop on a candidate function,
each fix validated by the coverage suite; the first fix that validates is the repair."""

import json
from pathlib import Path

from dap_server.cli import main

HERE = Path(__file__).parent / "models" / "candidates"
REF = str(HERE / "reference.py")


def repair(capsys, candidate: str, function: str, against: str, *fixes: str) -> tuple[int, dict]:
    argv = ["repair", "--function", function, str(HERE / candidate), "--against", f"{REF}:{against}", "--json"]
    for fix in fixes:
        argv += ["--fix", str(HERE / fix)]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code != 2, err
    return code, json.loads(out)


def test_the_fix_that_passes_the_suite_is_the_repair_and_a_wrong_fix_is_rejected(capsys):
    code, report = repair(capsys, "layer_norm.py", "layer_norm", "layer_norm", "layer_norm.py", "layer_norm_fixed.py")
    assert code == 0 and report["verdict"] == "repaired"
    assert report["pattern"]["pattern"] == "wrong-reduction-axis"
    rejected, validated = report["fixes"]
    assert rejected["verdict"] == "rejected" and rejected["failed"] > 0
    assert validated["verdict"] == "validated" and validated["cases"] > 10
    assert report["repair"] == str(HERE / "layer_norm_fixed.py")


def test_no_fix_that_validates_is_not_a_repair(capsys):
    code, report = repair(capsys, "off_by_one.py", "offset_attention", "sdpa_attention", "blocked_attention_fixed.py")
    assert code == 1 and report["verdict"] == "not repaired" and report["repair"] is None
    assert "defines no function 'offset_attention'" in report["fixes"][0]["reason"]


def test_repair_without_a_fix_is_refused_in_words(capsys):
    try:
        main(["repair", "--function", "layer_norm", str(HERE / "layer_norm.py"), "--against", f"{REF}:layer_norm"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "--fix" in capsys.readouterr().err
