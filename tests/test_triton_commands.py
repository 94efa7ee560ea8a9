"""The kernel tools through the `rewind` command: forensics names the planted kernel's line (text and --json, exit
status 1) and is clean on its twin (0); validate holds a fix and refuses a wrapper; repair validates a fix."""

import importlib.util
import json

import pytest

from tests.dap.wire import MODELS, rewind

KERNELS = MODELS / "kernels"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the kernels extra (triton)")


def line_of(file: str, text: str) -> int:
    return next(i for i, line in enumerate((KERNELS / file).read_text().splitlines(), 1) if text in line)


def test_rewind_forensics_names_a_planted_kernels_line_and_is_clean_on_its_twin():
    done = rewind("forensics", str(KERNELS / "layernorm_stride.py"), "--entry", "kernel", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["line"] == line_of("layernorm_stride.py", "row * (stride - 1)")
    assert report["patterns"][0]["kind"] == "stride off by one" and report["wrong"]["out_ptr"]["count"] == 120
    text = rewind("forensics", str(KERNELS / "softmax_padded.py"), "--entry", "kernel")
    assert text.returncode == 1 and "the problem is at line 14 (padding counted)" in text.stdout
    clean = rewind("forensics", str(KERNELS / "layernorm_fixed.py"), "--entry=kernel")
    assert clean.returncode == 0 and "every output matches the reference" in clean.stdout


def test_rewind_validate_holds_a_fix_and_refuses_a_wrapper_and_repair_validates_the_fix():
    fixed = rewind("validate", str(KERNELS / "scale_fixed.py"), "--original", str(KERNELS / "scale_oob.py"),
                   "--entry", "kernel", "--json")
    assert fixed.returncode == 0, fixed.stderr
    report = json.loads(fixed.stdout)
    # the unmasked load is out of bounds at every n but the block multiples (32, 64): the suite has both
    assert report["verdict"] == "validated" and 0 < report["originalFails"] == report["casesRun"] - 2
    wrapper = rewind("validate", str(KERNELS / "softmax_wrapper.py"), "--original", str(KERNELS / "softmax_padded.py"),
                     "--entry", "kernel")
    assert wrapper.returncode == 1 and "refused: wrapper-assisted" in wrapper.stdout and "Error" not in wrapper.stdout
    repaired = rewind("repair", str(KERNELS / "sum_race.py"), "--fix", str(KERNELS / "sum_atomic.py"),
                      "--entry", "kernel", "--json")
    assert repaired.returncode == 0, repaired.stderr
    body = json.loads(repaired.stdout)
    assert body["original"]["patterns"][0]["kind"] == "race" and body["fixes"][0]["verdict"] == "validated"


def test_a_missing_kernel_file_is_said_in_words():
    done = rewind("forensics", str(KERNELS / "no_such_kernel.py"), "--entry", "kernel")
    assert done.returncode == 2 and "there is no kernel file" in done.stderr and "Traceback" not in done.stderr
