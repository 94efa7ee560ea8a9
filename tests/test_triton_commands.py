"""The kernel tools through the `rewind` command: forensics names the planted kernel's line (text and --json, exit
status 1) and is clean on its twin (0); validate holds a fix and refuses a wrapper; repair validates a fix;
`--against OP` compares with a torch op (hostile ones refused in words, exit status 2); the float16 and bfloat16
cases of the coverage suite."""

import importlib.util
import json
import re

import pytest
import torch

from dap_server.cli import main
from hardware.drivers.triton.launch import interpreter_refuses
from tests.dap.wire import MODELS, ROOT, rewind

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


def test_forensics_against_an_op_checks_a_kernel_file_without_a_reference(tmp_path):
    text = (KERNELS / "softmax_fixed.py").read_text()
    path = tmp_path / "softmax_unreferenced.py"
    path.write_text(text[:text.index("def reference")])
    plain = rewind("forensics", str(path), "--entry", "kernel", "--json")
    assert plain.returncode == 0 and json.loads(plain.stdout)["checked"] is False, plain.stderr
    done = rewind("forensics", str(path), "--entry", "kernel", "--against", "torch.softmax(x_ptr, dim=-1)", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["checked"] and report["clean"] and report["against"] == "torch.softmax(x_ptr, dim=-1)"
    columns = rewind("forensics", str(path), "--entry", "kernel", "--against", "torch.softmax(x_ptr, dim=0)")
    assert columns.returncode == 1, columns.stderr
    assert "compared with torch.softmax(x_ptr, dim=0) in float64" in columns.stdout
    assert "wrong output element(s)" in columns.stdout


def test_a_bare_op_is_called_with_the_tensors_the_kernel_only_reads():
    planted = rewind("forensics", str(KERNELS / "matmul_tail.py"), "--entry", "kernel", "--against", "matmul", "--json")
    assert planted.returncode == 1, planted.stderr
    report = json.loads(planted.stdout)
    assert report["against"] == "torch.matmul(a_ptr, b_ptr)" and report["patterns"][0]["kind"] == "tail dropped"
    fixed = rewind("forensics", str(KERNELS / "matmul_fixed.py"), "--entry", "kernel", "--against", "torch.matmul")
    assert fixed.returncode == 0 and "every output matches torch.matmul(a_ptr, b_ptr)" in fixed.stdout


def test_validate_and_repair_against_an_op_hold_the_fix_where_the_original_fails():
    op = "F.layer_norm(x_ptr, (n_cols,), w_ptr, eps=eps)"
    done = rewind("validate", str(KERNELS / "layernorm_fixed.py"), "--original", str(KERNELS / "layernorm_stride.py"),
                  "--entry", "kernel", "--against", op, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "validated" and report["against"] == op and report["originalFails"] > 0
    repaired = rewind("repair", str(KERNELS / "scale_oob.py"), "--fix", str(KERNELS / "scale_fixed.py"),
                      "--entry", "kernel", "--against", "torch.mul(x_ptr, factor)", "--json")
    assert repaired.returncode == 0, repaired.stderr
    body = json.loads(repaired.stdout)
    assert body["original"]["against"] == "torch.mul(x_ptr, factor)"
    assert body["original"]["patterns"][0]["kind"] == "out of bounds" and body["fixes"][0]["verdict"] == "validated"


HOSTILE = [  # --against, the words that say what is wrong with it
    ("torch.no_such_op", "there is no op 'no_such_op' in torch"),
    ("no_such_op", "there is no op 'no_such_op' in torch, torch.nn.functional, torch.special or torch.linalg"),
    ("torch.softmax(y, dim=-1)", "'y' in --against is not a parameter of softmax_kernel"),
    ("torch.softmax(x_ptr.exp(), dim=-1)", "the argument 'x_ptr.exp()' is a call"),
    ("torch.softmax(x_ptr.T, dim=-1)", "the argument 'x_ptr.T' is an attribute"),
    ("__import__('os').system('touch pwned')", "'__import__('os')' is a call, not an op's name"),
    ("__import__", "'__import__' is a dunder name"),
    ("torch.softmax.__globals__", "'__globals__' is a dunder name"),
    ("lambda x: x", "'lambda x: x' is a lambda"),
    ("torch.softmax(x_ptr, dim=(lambda: 0)())", "is a call"),
    ("torch.save(x_ptr, 'pwned')", "torch.save is not an op on tensors"),
    ("os.system", "'os' is not a namespace --against looks in"),
    ("torch.softmax(x_ptr, dim=5)", "failed on the launch's tensors: Dimension out of range"),
    ("torch.max(x_ptr, dim=1)", "returns 2 value(s); the kernel writes 1 tensor(s) (out_ptr)"),
    ("torch.sum(x_ptr, dim=1)", "gives out_ptr a value of shape [4]; the kernel's out_ptr is [4, 10]"),
    ("torch.softmax(x_ptr,", "cannot be read: '(' was never closed"),
    ("torch.repeat_interleave(x_ptr, 1000000000)", "a value of shape [40000000000]; the kernel's out_ptr is [4, 10]"),
]


@pytest.mark.parametrize("op,words", HOSTILE)
def test_a_hostile_against_is_refused_in_words_with_a_usage_error(op, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where a call that ran would leave its file
    code = main(["forensics", str(KERNELS / "softmax_fixed.py"), "--entry", "kernel", "--against", op])
    said = capsys.readouterr()
    assert code == 2 and words in said.err, said.err
    assert said.out == "" and not re.search(r"\b[A-Z]\w*(Error|Exception)\b|Traceback", said.err)
    assert list(tmp_path.iterdir()) == []


def test_a_hostile_against_through_the_command_exits_2_and_runs_nothing():
    done = rewind("forensics", str(KERNELS / "softmax_fixed.py"), "--entry", "kernel", "--against",
                  "__import__('os').system('touch pwned_by_against')")
    assert done.returncode == 2 and "is a call, not an op's name" in done.stderr and "Traceback" not in done.stderr
    assert not (ROOT / "pwned_by_against").exists()


@pytest.mark.parametrize("command", [["forensics", "chatty.py"], ["validate", "chatty.py", "--original", "chatty.py"]])
def test_against_without_entry_kernel_is_refused_in_words(command, capsys):
    code = main([command[0], *(str(MODELS / a) if a.endswith(".py") else a for a in command[1:]),
                 "--against", "softmax"])
    said = capsys.readouterr().err
    assert code == 2 and "--against OP compares a Triton kernel's outputs with a torch op" in said
    assert "--entry kernel" in said


def test_a_kernel_that_overflows_in_float16_is_rejected_by_its_float16_case_alone():
    planted = rewind("validate", str(KERNELS / "rmsnorm_half.py"), "--original", str(KERNELS / "rmsnorm_half.py"),
                     "--entry", "kernel", "--json")
    assert planted.returncode == 1, planted.stderr
    report = json.loads(planted.stdout)
    failing = [c for c in report["cases"] if c["verdict"] == "fails"]
    assert report["verdict"] == "rejected" and [c["dtype"] for c in failing] == ["float16"]
    assert failing[0]["tolerance"] == {"rtol": 1e-2, "atol": 1e-3}
    assert failing[0]["line"] == line_of("rmsnorm_half.py", "tl.store")
    fixed = rewind("validate", str(KERNELS / "rmsnorm_fixed.py"), "--original", str(KERNELS / "rmsnorm_half.py"),
                   "--entry", "kernel", "--json")
    assert fixed.returncode == 0, fixed.stderr
    body = json.loads(fixed.stdout)
    by_dtype = {c["dtype"]: c for c in body["cases"] if c["dtype"]}
    assert body["verdict"] == "validated" and body["originalFails"] == 1
    assert by_dtype["float16"]["verdict"] == "holds" and by_dtype["float16"]["original"] == "fails"
    refused = interpreter_refuses(torch.bfloat16)
    if refused is None:
        assert by_dtype["bfloat16"]["verdict"] == "holds" and body["casesNotRun"] == 0
    else:  # said as not run, with why, for both files; not counted as run
        assert by_dtype["bfloat16"]["verdict"] == "not run" and by_dtype["bfloat16"]["reason"] == refused
        assert by_dtype["bfloat16"]["original"] == f"not run: {refused}"
        assert body["casesNotRun"] == 1 and body["casesRun"] == len(body["cases"]) - 1
