"""`rewind forensics model.py`: the one-shot command, in JSON for agents and in words for people."""

import json
import subprocess
import sys

import pytest

from provenance import forensics_cli
from tests.conftest import MODELS, ROOT
from tests.forensics_cases import CLEAN, FORENSICS, PLANTED, ids


def forensics(capsys, *args: str) -> tuple[int, str, str]:
    status = forensics_cli.main([*map(str, args), "--driver", "torch:cpu", "--budget-mb", "64"])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("case", PLANTED, ids=ids(PLANTED))
def test_command_names_the_line_node_pattern_and_a_precision_fix_of_each_planted_bug(capsys, case):
    status, out, _ = forensics(capsys, case.path, "--json")
    report = json.loads(out)
    assert status == 1 and report["problem"]
    if case.nonfinite:
        _, node, pattern, marker = case.nonfinite
        found = report["nonfinite"]
        assert (found["node"], found["pattern"]["pattern"]) == (node, pattern)
        assert found["source"]["line"] == case.line(marker)
        assert found["referenceAgrees"] is not case.precision_fixes
    if case.divergence:
        node, pattern, marker = case.divergence
        found = report["divergence"]
        assert (found["node"], found["pattern"]["pattern"]) == (node, pattern)
        assert found["source"]["line"] == case.line(marker)
        assert found["growth"] and found["observed"]["mismatches"] > 0
    if case.precision_fixes:
        fix = report["ablation"]["found"]
        assert fix["fixed"] and all(o["within"] for o in fix["after"]) and not all(o["within"] for o in fix["before"])
    else:
        assert report["ablation"] is None and all(o["within"] for o in report["outputs"])


@pytest.mark.parametrize("path", CLEAN, ids=ids(CLEAN))
def test_command_finds_nothing_in_clean_models_and_exits_zero(capsys, path):
    status, out, _ = forensics(capsys, path, "--json")
    report = json.loads(out)
    assert status == 0 and not report["problem"]
    assert report["nonfinite"] is None and report["divergence"] is None and report["ablation"] is None


def test_human_report_shows_the_source_line_evidence_pattern_and_fix(capsys):
    status, out, _ = forensics(capsys, FORENSICS / "softmax_overflow.py")
    assert status == 1
    assert f"softmax_overflow.py:{PLANTED[0].line('# BUG')}    weights = torch.exp(scores)" in out
    assert "[exp-overflow]" in out and "fix: subtract the row max" in out
    assert "input matmul: min" in out and "error growth downstream" in out
    assert "Precision ablation" in out and "brings the outputs within tolerance" in out
    assert out.rstrip().endswith("Verdict: problem found")


def test_saved_reference_is_written_and_read_back(capsys, tmp_path):
    saved = tmp_path / "reference.pt"
    status, _, _ = forensics(capsys, FORENSICS / "cancellation.py", "--no-ablate", "--save-reference", saved)
    assert status == 1 and saved.is_file()
    status, out, _ = forensics(capsys, FORENSICS / "cancellation.py", "--json", "--no-ablate", "--reference", saved)
    report = json.loads(out)
    assert status == 1 and report["reference"] == str(saved) and report["divergence"]["node"] == "rsub"


def test_bad_model_or_reference_exits_two_with_the_cause(capsys, tmp_path):
    status, _, err = forensics(capsys, tmp_path / "missing.py")
    assert status == 2 and "program file not found" in err
    status, _, err = forensics(capsys, MODELS / "bad_models.py", "--entry", "raises")
    assert status == 2 and "weights file missing" in err
    status, _, err = forensics(capsys, FORENSICS / "cancellation.py", "--reference", "torch:cpu:int8")
    assert status == 2 and "reference" in err


def test_rewind_forensics_subcommand_runs_in_a_fresh_process():
    command = [sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())",
               "forensics", str(FORENSICS / "cancellation.py"), "--driver", "torch:cpu", "--no-ablate"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "First divergence from the reference: cancellation.py:" in done.stdout
