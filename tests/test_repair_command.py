"""`rewind repair model.py --fix fix.py [--json]`: the repair loop as a command, in JSON for agents and in words."""

import json
import subprocess
import sys

import pytest

from provenance import repair_cli
from tests.conftest import MODELS, ROOT
from tests.forensics_cases import FORENSICS

FIXES = MODELS / "fixes"
SOFTMAX = FORENSICS / "softmax_overflow.py"


@pytest.fixture
def knowledge(tmp_path):
    return tmp_path / "fixes.json"


def repair(capsys, knowledge, *args) -> tuple[int, str, str]:
    status = repair_cli.main([*map(str, args), "--driver", "torch:cpu", "--budget-mb", "64", "--knowledge",
                              str(knowledge)])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_good_fix_validates_exits_zero_and_is_recorded(capsys, knowledge):
    status, out, _ = repair(capsys, knowledge, SOFTMAX, "--fix", FIXES / "stable_softmax.py", "--json")
    report = json.loads(out)
    assert status == 0 and report["verdict"] == "validated"
    assert report["fix"]["name"] == "stable_softmax.py" and report["fix"]["patches"][0]["node"] == "exp"
    assert report["knowledge"]["recorded"] == {"pattern": "exp-overflow", "name": "stable_softmax.py",
                                               "validations": 1, "inputSetsPassed": 8, "rejections": 0}
    assert json.loads(knowledge.read_text())["fixes"][0]["pattern"] == "exp-overflow"


def test_a_wrong_fix_is_rejected_with_evidence_and_exits_one(capsys, knowledge):
    status, out, _ = repair(capsys, knowledge, FORENSICS / "rsqrt_no_epsilon.py", "--fix", FIXES / "large_epsilon.py",
                            "--json", "--seeds", "1", "--scales", "4", "--shapes", "0")
    report = json.loads(out)
    assert status == 1 and report["verdict"] == "rejected"
    checks = report["attempts"][0]["validation"]["checks"]
    assert [c["inputs"]["name"] for c in checks] == ["example", "seed 1", "range x4"]
    assert all(not c["within"] and c["outputs"][0]["error"] > 1 for c in checks)
    assert report["knowledge"]["recorded"] is None
    (entry,) = json.loads(knowledge.read_text())["fixes"]
    assert (entry["name"], entry["validations"], entry["rejections"]) == ("large_epsilon.py", 0, 1)


def test_a_fix_copying_the_reference_is_refused_and_the_next_fix_still_tried(capsys, knowledge):
    status, out, _ = repair(capsys, knowledge, SOFTMAX, "--fix", FIXES / "copies_reference.py",
                            "--fix", FIXES / "stable_softmax.py")
    assert status == 0
    assert "Attempt 1: copies_reference.py: REJECTED: the integrity check refused the fix" in out
    assert "  refused: imports gc (copies_reference.py:4)" in out
    assert "Attempt 2: stable_softmax.py: VALIDATED" in out and "  shape x[2, 8, 16]: ok (worst output error" in out
    assert "Recorded in the knowledge base" in out and out.rstrip().endswith(
        "Verdict: validated: outputs within tolerance of the reference on all 8 input sets, and no NaN/Inf born "
        "that the reference does not absorb")


def test_without_a_fix_the_knowledge_base_suggests_one_that_validates(capsys, knowledge):
    status, out, _ = repair(capsys, knowledge, FORENSICS / "masked_row.py", "--json")
    report = json.loads(out)
    assert status == 0 and report["verdict"] == "validated"
    assert report["fix"]["origin"] == "built-in" and report["fix"]["patches"][0]["node"] == "softmax"


def test_bad_arguments_exit_two_with_the_cause(capsys, knowledge, tmp_path):
    status, _, err = repair(capsys, knowledge, SOFTMAX, "--fix", tmp_path / "missing.py")
    assert status == 2 and "fix file not found" in err
    status, _, err = repair(capsys, knowledge, SOFTMAX, "--max-attempts", "0")
    assert status == 2 and "at least 1 attempt" in err
    status, _, err = repair(capsys, knowledge, tmp_path / "missing_model.py")
    assert status == 2 and "program file not found" in err


def test_rewind_repair_subcommand_runs_in_a_fresh_process(tmp_path):
    command = [sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())", "repair",
               str(SOFTMAX), "--fix", str(FIXES / "stable_softmax.py"), "--driver", "torch:cpu", "--knowledge",
               str(tmp_path / "fixes.json"), "--shapes", "0"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Verdict: validated" in done.stdout
