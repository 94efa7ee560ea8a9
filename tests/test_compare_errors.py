"""Bad input to `rewind compare` and `rewind validate --function`: a clear error in the user's terms (exit 2, no
Python exception name), for wrong paths, missing functions, mismatched signatures and outputs, a revision that
does not exist, a folder outside git."""

import subprocess
from pathlib import Path

import pytest

from dap_server.cli import main

HERE = Path(__file__).parent / "models" / "candidates"
REF = str(HERE / "reference.py")
EXCEPTION_NAMES = ("Error", "Exception", "Traceback")


def refused(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == ""
    assert not any(name in err for name in EXCEPTION_NAMES), err
    return err


def test_a_candidate_file_that_does_not_exist(capsys):
    err = refused(capsys, "compare", "no_such.py", "--function", "f", "--against", f"{REF}:sdpa_attention")
    assert "the candidate file no_such.py does not exist" in err


def test_a_reference_that_is_neither_a_file_nor_a_driver(capsys):
    err = refused(capsys, "compare", str(HERE / "blocked_attention.py"), "--function", "blocked_attention",
                  "--against", "reference.txt")
    assert "is not a Python file" in err and "torch:cpu:float64" in err


def test_a_function_the_file_does_not_define(capsys):
    err = refused(capsys, "compare", str(HERE / "blocked_attention.py"), "--function", "flash",
                  "--against", f"{REF}:sdpa_attention")
    assert "blocked_attention.py defines no function 'flash' (its functions: blocked_attention, inputs)" in err


def test_a_reference_function_the_file_does_not_define(capsys):
    err = refused(capsys, "compare", str(HERE / "blocked_attention.py"), "--function", "blocked_attention",
                  "--against", f"{REF}:flash")
    assert "reference.py:flash defines no function 'flash'" in err


def test_arguments_the_reference_cannot_take(capsys):
    err = refused(capsys, "compare", str(HERE / "layer_norm.py"), "--function", "layer_norm",
                  "--against", f"{REF}:sdpa_attention")
    assert ("calling sdpa_attention() of reference.py with the arguments (float32[32, 24], float32[24], "
            "float32[24]) failed") in err


def test_arguments_one_side_cannot_take(capsys, tmp_path):
    two = tmp_path / "two.py"
    two.write_text("def f(q, k):\n    return q @ k.T\n\n\ndef inputs():\n    import torch\n    return "
                   "(torch.ones(2, 3), torch.ones(2, 3))\n")
    err = refused(capsys, "compare", str(two), "--function", "f", "--against", f"{REF}:sdpa_attention")
    assert "signatures do not match: f(q, k) takes 2 argument(s) where sdpa_attention(q, k, v) takes 3" in err


def test_outputs_of_another_shape(capsys, tmp_path):
    wide = tmp_path / "wide.py"
    wide.write_text("import torch\n\n\ndef f(q, k, v):\n    return torch.cat([q, q], dim=-1)\n")
    err = refused(capsys, "compare", str(wide), "--function", "f", "--against", f"{REF}:sdpa_attention",
                  "--inputs", f"{REF}:attention_inputs")
    assert "output 1 is float32[64, 32]" in err and "float32[64, 16]" in err


def test_no_arguments_to_call_the_functions_with(capsys, tmp_path):
    bare = tmp_path / "bare.py"
    bare.write_text("def f(q, k, v):\n    return q\n")
    bare_ref = tmp_path / "bare_ref.py"
    bare_ref.write_text("def f(q, k, v):\n    return q\n")
    err = refused(capsys, "compare", str(bare), "--function", "f", "--against", str(bare_ref))
    assert "no arguments to call f with: give --inputs file.py:fn" in err


def test_a_candidate_that_raises(capsys, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(q, k, v):\n    raise ValueError('block size must divide the length')\n")
    err = refused(capsys, "compare", str(broken), "--function", "f", "--against", f"{REF}:sdpa_attention",
                  "--inputs", f"{REF}:attention_inputs")
    assert ("calling f() of broken.py with the arguments (float32[64, 16], float32[64, 16], float32[64, 16]) "
            "failed: block size must divide the length (at broken.py:2)") in err


def test_a_driver_as_the_candidate(capsys):
    err = refused(capsys, "compare", "torch:cpu", "--against", str(HERE / "norm_model.py"))
    assert "the candidate is a model or a function, not the driver torch:cpu" in err


def test_a_driver_that_does_not_exist(capsys):
    err = refused(capsys, "compare", str(HERE / "norm_model.py"), "--against", "torch:tpu:float64")
    assert "torch:tpu:float64" in err


def test_a_revision_that_does_not_exist(capsys, tmp_path):
    model = tmp_path / "model.py"
    model.write_text((HERE / "norm_model.py").read_text())
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "model.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "model"], check=True)
    err = refused(capsys, "compare", str(model), "--against", f"{model}@HEAD~4")
    assert "model.py@HEAD~4: git has no model.py at revision HEAD~4" in err


def test_a_revision_outside_git(capsys, tmp_path):
    model = tmp_path / "model.py"
    model.write_text((HERE / "norm_model.py").read_text())
    err = refused(capsys, "compare", str(model), "--against", f"{model}@HEAD~1")
    assert "is not inside a git repository, so it has no revision HEAD~1" in err


def test_validate_without_a_function(capsys):
    assert main(["validate", str(HERE / "norm_model.py"), "--original", str(HERE / "norm_model.py"),
                 "--json"]) in (0, 1)  # the edited-copy validation is untouched
    capsys.readouterr()


def test_validate_a_function_against_a_driver(capsys):
    err = refused(capsys, "validate", "--function", "layer_norm", str(HERE / "layer_norm_fixed.py"),
                  "--against", "torch:cpu:float64")
    assert "validate compares a function with a reference function" in err


def test_models_built_with_other_weights(capsys, tmp_path):
    reseeded = tmp_path / "reseeded.py"
    reseeded.write_text((HERE / "norm_model.py").read_text().replace("torch.manual_seed(0)", "torch.manual_seed(1)"))
    err = refused(capsys, "compare", str(reseeded), "--against", str(HERE / "norm_model.py"))
    assert "reseeded.py builds different weights for 'up.weight' than norm_model.py: seed both the same way" in err


def test_models_built_with_inputs_of_other_shapes(capsys, tmp_path):
    wider = tmp_path / "wider.py"
    wider.write_text((HERE / "norm_model.py").read_text().replace("torch.randn(4, 16)", "torch.randn(5, 16)"))
    err = refused(capsys, "compare", str(wider), "--against", str(HERE / "norm_model.py"))
    assert "wider.py builds inputs of shapes [[5, 16]] where norm_model.py builds [[4, 16]]" in err
