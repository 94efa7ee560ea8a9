"""`rewind validate fixed.py --original model.py [--json]`: an edited copy of a model validated on the original's
input sets by the repair loop's rules, with the nodes the edit changed; an unusable copy exits 2 with the cause."""

import json
import shutil

import pytest

from dap_server import cli
from provenance import validate_cli
from tests.conftest import MODELS

EDITS = MODELS / "edits"
ORIGINAL = EDITS / "rms_norm.py"
FEW_SETS = ["--seeds", "1", "--scales", "2", "--shapes", "0"]
LEAKS = ("Error", "Exception", "Traceback")  # Python's words, not the user's


def validate(capsys, copy, *args, original=ORIGINAL) -> tuple[int, str, str]:
    status = validate_cli.main([str(copy), "--original", str(original), "--driver", "torch:cpu", "--budget-mb", "64",
                                *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def edited(tmp_path, name: str, old: str, new: str) -> str:
    """A copy of the original with `old` replaced by `new`."""
    text = ORIGINAL.read_text()
    assert old in text
    (tmp_path / name).write_text(text.replace(old, new))
    return str(tmp_path / name)


def test_a_copy_with_an_epsilon_validates_on_the_default_input_sets_and_names_the_nodes_it_changed(capsys):
    status, out, _ = validate(capsys, EDITS / "rms_norm_eps.py", "--json")
    report = json.loads(out)
    assert status == 0 and report["verdict"] == "validated", report["reason"]
    checks = report["validation"]["checks"]
    assert {c["inputs"]["kind"] for c in checks} == {"example", "seed", "range", "shape"} and all(
        c["within"] for c in checks)
    assert [c["inputs"]["name"] for c in checks] == [s["name"] for s in report["inputs"] if "name" in s]
    (hunk,) = report["changes"]["hunks"]
    assert [n["op"] for n in hunk["original"]] == ["aten.mul.Tensor", "aten.mean.dim", "aten.rsqrt.default"]
    assert [n["op"] for n in hunk["fixed"]] == ["aten.mul.Tensor", "aten.mean.dim", "aten.add.Tensor",
                                               "aten.rsqrt.default"]
    assert hunk["fixed"][2]["text"].endswith("+ 1e-5)  # FIX: an epsilon") and hunk["fixed"][2]["module"] == "norm"
    assert report["changes"]["unchanged"] == 3 and report["changes"]["values"] == []


def test_an_edit_that_does_not_fix_the_norm_is_rejected_with_the_sets_it_failed_on(tmp_path, capsys):
    copy = edited(tmp_path, "big_epsilon.py", "keepdim=True))", "keepdim=True) + 1.0)")
    status, out, _ = validate(capsys, copy, *FEW_SETS)
    assert status == 1
    assert ("  + add (aten.add.Tensor) at big_epsilon.py:17: scale = torch.rsqrt((x * x).mean(-1, keepdim=True) + 1.0)"
            "  # BUG: no epsilon") in out.splitlines()
    assert "  example: FAILED (outputs beyond tolerance of the reference; worst output error" in out
    assert "Verdict: rejected: outputs beyond tolerance of the reference (on example, seed 1, range x2)" in out


def test_a_copy_identical_to_the_original_changes_no_node_and_is_rejected(tmp_path, capsys):
    shutil.copy(ORIGINAL, tmp_path / "same.py")
    status = cli.main(["validate", str(tmp_path / "same.py"), "--original", str(ORIGINAL), "--driver", "torch:cpu",
                       "--json", *FEW_SETS])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["verdict"] == "rejected" and report["reason"] == validate_cli.NO_CHANGE
    assert report["changes"]["hunks"] == [] and report["validation"] is None
    assert report["validationReason"] == "not run: " + validate_cli.NO_CHANGE


SYS_EXIT = "\n\nimport sys\n\n\ndef build():\n    sys.exit(3)\n"
UNUSABLE = {  # what the copy is (made from the original), the options, what the error says
    "missing copy": (None, [], "program file not found"),
    "syntax error": (("class Block(nn.Module):", "class Block(nn.Module:"), [], "importing"),
    "build raises": (("torch.manual_seed(11)", "raise ValueError('no weights today')"), [], "no weights today"),
    "build exits": (("return Block().half(), (x.half(),)\n", "return Block().half(), (x.half(),)\n" + SYS_EXIT), [],
                    "the program called sys.exit(3) while loading build_exits.py"),
    "no entry": (("def build():", "def make():"), [], "defines no 'build'"),
    "build returns no module": (("return Block().half(), (x.half(),)", "return 3, (x.half(),)"), [],
                                "returned int where a torch.nn.Module belongs"),
    "other input shape": (("(x.half(),)", "(x.half()[:2],)"), [],
                          "other_input_shape.py's input 1 'x' is float16[2, 16] where rms_norm.py's 'x' is "
                          "float16[4, 16]"),
    "export fails": (("return self.proj(self.norm(x))", "return self.proj(self.norm(x)) if x.sum() > 0 else x"), [],
                     "decides on a tensor's values (data-dependent control flow)"),
    "other weights": (("torch.manual_seed(11)", "torch.manual_seed(12)"), [],
                      "other_weights.py builds different weights for 'norm.weight' than rms_norm.py: seed it the same "
                      "way"),
    "other output shape": (("return self.proj(self.norm(x))", "return self.proj(self.norm(x))[:, :8]"), [],
                           "other_output_shape.py's output 1 'slice_1' is float16[4, 8] where rms_norm.py's 'linear' is "
                           "float16[4, 16]"),
    "negative seeds": (("# BUG: no epsilon", "# edited"), ["--seeds", "-1"], "seeds and shapes are counts >= 0"),
    "no time": (("# BUG: no epsilon", "# edited"), ["--time-limit", "0"], "a number of seconds above 0, got 0"),
    "missing original": (("# BUG: no epsilon", "# edited"), ["--original-missing"], "program file not found"),
}


@pytest.mark.parametrize("case", UNUSABLE)
def test_an_unusable_copy_or_option_exits_two_naming_the_cause(tmp_path, capsys, case):
    change, options, said = UNUSABLE[case]
    name = case.replace(" ", "_") + ".py"
    copy = edited(tmp_path, name, *change) if change else tmp_path / name
    original = tmp_path / "gone.py" if "--original-missing" in options else ORIGINAL
    status, _, err = validate(capsys, copy, *[o for o in options if o != "--original-missing"], original=original)
    assert status == 2 and said in err, err
    assert not any(word in err for word in LEAKS), err
