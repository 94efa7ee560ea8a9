"""A validated fix written into the user's own file: `rewind repair` prints a unified diff of the model's source
that, applied to a copy, `rewind validate` validates; what one line cannot say is listed with why. (The DAP repair
request's `sourceDiffs`: tests/dap/test_experiments.py.)"""

import json
import os
import shutil
import subprocess

import pytest

from checkpoint.branch import EditPatch, FunctionPatch, PrecisionPatch
from provenance import repair_cli, validate_cli
from provenance.fixes import Candidate, FunctionSource
from provenance.source_edits import NO_FIX, source_edits, source_fields
from tests.conftest import MODELS, line_of, program
from tests.forensics_cases import FORENSICS

EDITS = MODELS / "edits"
FEW_SETS = ["--seeds", "1", "--scales", "2", "--shapes", "0"]


def applied(folder, diff: str) -> None:
    """The diff applied as a user applies it, from the folder the model is in."""
    (folder / "fix.diff").write_text(diff)
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def validated(capsys, copy, original) -> tuple[int, dict]:
    status = validate_cli.main([str(copy), "--original", str(original), "--driver", "torch:cpu", "--budget-mb", "64",
                                "--json", *FEW_SETS])
    return status, json.loads(capsys.readouterr().out)


def repaired(capsys, tmp_path, model, fix) -> dict:
    """`rewind repair` on a copy of `model` in `tmp_path` with the fix file `fix`: its verdict, validated."""
    copy = tmp_path / "model.py"
    shutil.copy(model, copy)
    status = repair_cli.main([str(copy), "--fix", str(fix), "--driver", "torch:cpu", "--budget-mb", "64",
                              "--knowledge", str(tmp_path / "kb.json"), "--json", *FEW_SETS])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["verdict"] == "validated" and report["notInSource"] == []
    assert [d["file"] for d in report["sourceDiffs"]] == [os.path.realpath(copy)]
    return report


def test_a_replaced_function_is_printed_as_a_diff_whose_edited_copy_validates(tmp_path, capsys):
    report = repaired(capsys, tmp_path, EDITS / "rms_norm.py", EDITS / "rms_norm_fix.py")
    (diff,) = report["sourceDiffs"]
    added = [line for line in diff["diff"].splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert "+EPSILON = 1e-6  # small beside any mean square a real row has" in added  # with what the function uses
    assert "+def rsqrt_plus_epsilon(mean_square):" in added and diff["notes"] == []
    assert "+        scale = rsqrt_plus_epsilon((x * x).mean(-1, keepdim=True))  # BUG: no epsilon" in added
    assert diff["diff"].rstrip("\n") in repair_cli.render(report)  # printed as it is in the JSON
    applied(tmp_path, diff["diff"])
    status, check = validated(capsys, tmp_path / "model.py", EDITS / "rms_norm.py")
    assert status == 0 and check["verdict"] == "validated", check["reason"]
    assert "aten.add.Tensor" in [n["op"] for h in check["changes"]["hunks"] for n in h["fixed"]]


def test_a_line_in_float32_and_an_epsilon_keyword_are_printed_as_a_diff_whose_edited_copy_validates(tmp_path,
                                                                                                    capsys):
    report = repaired(capsys, tmp_path, EDITS / "half_norms.py", EDITS / "half_norms_fix.py")
    (diff,) = report["sourceDiffs"]
    lines = diff["diff"].splitlines()
    assert "+        self.norm = nn.LayerNorm(width, eps=1e-05)  # BUG: no epsilon" in lines
    assert ("+        length = x.to(torch.float32).pow(2).sum(-1, keepdim=True).sqrt().to(x.dtype)  # BUG: the sum of "
            "squares overflows float16") in lines
    assert sum(line.startswith("+") for line in lines) == 3  # the two lines, and the +++ header
    applied(tmp_path, diff["diff"])
    status, check = validated(capsys, tmp_path / "model.py", EDITS / "half_norms.py")
    assert status == 0 and check["verdict"] == "validated", check["reason"]


def test_what_one_line_cannot_say_is_listed_with_why_and_nothing_half_written():
    running = program(str(FORENSICS / "bf16_accumulation.py"))
    chain = [n for n in running.nodes if n.op == "aten.add.Tensor"]
    edits = source_edits(running, Candidate("chain", "built-in", [PrecisionPatch(n.index, "float32") for n in chain]))
    assert edits.diffs == [] and [e["node"] for e in edits.not_expressed] == [n.name for n in chain]
    assert "each reading the last one's result through a variable" in edits.not_expressed[0]["why"]
    norm = program(str(EDITS / "rms_norm.py"))
    linear, rsqrt = (next(n for n in norm.nodes if n.name == name) for name in ("linear", "rsqrt"))
    edits = source_edits(norm, Candidate("mixed", "fix", [PrecisionPatch(linear.index, "float32"),
                                                          EditPatch(rsqrt.index, "rsqrt", (0, 0), 1.0)]))
    why = {e["node"]: e["why"] for e in edits.not_expressed}
    assert edits.diffs == []
    call = line_of(EDITS / "rms_norm.py", "return self.proj(self.norm(x))")
    assert why["linear"] == (f"torch's Linear module 'proj' makes it, called at line {call} `return "
                             "self.proj(self.norm(x))`, not an expression of yours")
    assert why["rsqrt"] == "a value edit changes the pass's data, not its code: an experiment, not a fix"
    assert source_fields(norm, None) == {"sourceDiffs": None, "sourceDiffsReason": NO_FIX, "notInSource": []}


CLASHES = {
    "imports torch otherwise": ("import numpy as torch\n\n\ndef f(x):\n    return torch.sqrt(x)\n", "f",
                                "imports 'torch' as something else"),
    "defines a model name": ("import torch\n\n\nclass RMSNorm:\n    pass\n\n\ndef f(x):\n    RMSNorm()\n"
                             "    return torch.rsqrt(x)\n", "f", "already defines 'RMSNorm' (line "),
    "no such function": ("def g(x):\n    return x\n", "f", "defines no function 'f'"),
    "no source": (None, "f", "the function's source is not known"),
}


@pytest.mark.parametrize("case", CLASHES)
def test_a_fix_function_the_file_cannot_take_is_listed_not_written(case):
    text, name, why = CLASHES[case]
    norm = program(str(EDITS / "rms_norm.py"))
    rsqrt = next(n for n in norm.nodes if n.name == "rsqrt")
    sources = {rsqrt.index: FunctionSource("fix.py", text, name)} if text else {}
    edits = source_edits(norm, Candidate(case, "fix", [FunctionPatch(rsqrt.index, abs)], sources))
    assert edits.diffs == [] and len(edits.not_expressed) == 1 and why in edits.not_expressed[0]["why"]
