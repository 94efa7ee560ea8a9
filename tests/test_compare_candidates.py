"""`rewind compare`: each planted candidate's headline names its line, through the CLI's text and its JSON; each
fix is clean; a wrapper of the reference's operator is refused with the call named."""

import json
from pathlib import Path

import pytest

from dap_server.cli import main

HERE = Path(__file__).parent / "models" / "candidates"
REF = str(HERE / "reference.py")


def line_of(file: str, text: str) -> int:
    lines = (HERE / file).read_text().splitlines()
    found = [i for i, line in enumerate(lines, 1) if text in line]
    assert len(found) == 1, (file, text, found)
    return found[0]


def compare(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def compare_json(capsys, *argv: str) -> tuple[int, dict]:
    code, out, err = compare(capsys, *argv, "--json")
    assert code != 2, err
    return code, json.loads(out)


FUNCTIONS = {  # candidate file -> (function, reference function, the planted line's text)
    "blocked_attention.py": ("blocked_attention", "sdpa_attention", "acc = acc + p @ vb"),
    "tail_block.py": ("tail_attention", "sdpa_attention", "for start in range(0, k.shape[0] - BLOCK + 1, BLOCK)"),
    "layer_norm.py": ("layer_norm", "layer_norm", "mean = x.mean(dim=0, keepdim=True)"),
    "off_by_one.py": ("offset_attention", "sdpa_attention", "kb, vb = k[start:start + BLOCK - 1]"),
}
PATTERNS = {"blocked_attention.py": "accumulator-not-rescaled", "tail_block.py": "tail-block-dropped",
            "layer_norm.py": "wrong-reduction-axis", "off_by_one.py": "block-index-off-by-one"}
MODELS = {  # candidate file -> (original, the planted line's text)
    "attention_refactor.py": ("attention_model.py", "q = self.k_proj(x)"),
    "norm_port.py": ("norm_model.py", "normed = x * torch.rsqrt(power + self.eps)"),
}


@pytest.mark.parametrize("file", sorted(FUNCTIONS))
def test_planted_function_headline_names_its_line(capsys, file):
    function, against, planted = FUNCTIONS[file]
    code, report = compare_json(capsys, str(HERE / file), "--function", function, "--against", f"{REF}:{against}")
    assert code == 1 and report["verdict"] == "departs"
    assert (report["source"]["file"], report["source"]["line"]) == (file, line_of(file, planted))
    assert planted in report["source"]["text"]
    assert f"line {line_of(file, planted)} of {file}" in report["headline"]
    code, text, _ = compare(capsys, str(HERE / file), "--function", function, "--against", f"{REF}:{against}")
    assert code == 1 and f"Headline: line {line_of(file, planted)} of {file}" in text


def test_blocked_attention_evidence_is_the_accumulator_and_the_rows_whose_max_lies_past_the_first_block(capsys):
    code, report = compare_json(capsys, str(HERE / "blocked_attention.py"), "--function", "blocked_attention",
                                "--against", f"{REF}:sdpa_attention")
    departure = report["departure"]
    assert departure["value"] == "acc" and departure["how"] == "prefix" and departure["iteration"] == 1
    evidence = " ".join(departure["evidence"])
    assert "no value of 'l' alone" in evidence
    assert "'m_new'" in evidence and "past the first block" in evidence
    wrong = report["outputs"][0]["wrong"]
    assert 0 < len(wrong["rows"]) < 64  # some rows are right: those whose max lies in the first block
    assert f"{len(wrong['rows'])} wrong rows of 64" in evidence


def test_tail_block_evidence_names_the_keys_no_line_reads(capsys):
    code, report = compare_json(capsys, str(HERE / "tail_block.py"), "--function", "tail_attention",
                                "--against", f"{REF}:sdpa_attention")
    assert report["departure"]["how"] == "tail"
    assert "'k'[48:60] along dim 0" in report["departure"]["evidence"][0]


@pytest.mark.parametrize("file", sorted(MODELS))
def test_planted_model_headline_names_its_line(capsys, file):
    original, planted = MODELS[file]
    code, report = compare_json(capsys, str(HERE / file), "--against", str(HERE / original))
    assert code == 1 and report["verdict"] == "departs"
    assert report["source"]["line"] == line_of(file, planted) and report["source"]["file"] == file
    assert report["departure"]["how"] == "names"


@pytest.mark.parametrize("file", sorted(FUNCTIONS))
def test_fixed_function_is_clean(capsys, file):
    function, against, _ = FUNCTIONS[file]
    fixed = file.replace(".py", "_fixed.py")
    code, report = compare_json(capsys, str(HERE / fixed), "--function", function, "--against", f"{REF}:{against}")
    assert code == 0 and report["verdict"] == "clean" and report["headline"] is None


@pytest.mark.parametrize("file", sorted(MODELS))
def test_fixed_model_is_clean(capsys, file):
    original, _ = MODELS[file]
    code, report = compare_json(capsys, str(HERE / file.replace(".py", "_fixed.py")), "--against",
                                str(HERE / original))
    assert code == 0 and report["verdict"] == "clean"


def test_wrapper_of_the_reference_operator_is_refused_with_the_call_named(capsys):
    code, report = compare_json(capsys, str(HERE / "wrapper_attention.py"), "--function", "tiled_attention",
                                "--against", f"{REF}:sdpa_attention")
    line = line_of("wrapper_attention.py", "F.scaled_dot_product_attention(")
    assert code == 1 and report["verdict"] == "refused" and report["outputs"] == []
    assert report["reason"].startswith(f"wrapper-assisted, not a kernel: line {line} of wrapper_attention.py")
    assert "aten.scaled_dot_product_attention" in report["reason"]


def test_the_same_program_on_another_driver_goes_through_the_reference(capsys):
    code, report = compare_json(capsys, str(HERE / "norm_model.py"), "--against", "torch:cpu:float64")
    assert code == 0 and report["reference"] == "torch:cpu:float64" and report["verdict"] == "clean"


@pytest.mark.parametrize("file", sorted(PATTERNS))
def test_each_planted_kernel_matches_its_knowledge_base_pattern(capsys, file):
    function, against, _ = FUNCTIONS[file]
    code, report = compare_json(capsys, str(HERE / file), "--function", function, "--against", f"{REF}:{against}")
    assert report["pattern"]["pattern"] == PATTERNS[file] and report["pattern"]["fix"]


def test_a_model_refactor_matches_no_kernel_pattern(capsys):
    code, report = compare_json(capsys, str(HERE / "attention_refactor.py"), "--against",
                                str(HERE / "attention_model.py"))
    assert report["pattern"] is None and report["patternReason"]


def test_the_same_program_on_another_driver_names_the_line_where_it_departs(capsys):
    model = HERE.parent / "precision" / "half_params_overflow.py"
    code, report = compare_json(capsys, str(model), "--against", "torch:cpu:float64")
    line = next(i for i, text in enumerate(model.read_text().splitlines(), 1) if "# BUG" in text)
    assert code == 1 and report["departure"]["how"] == "driver"
    assert report["source"]["line"] == line and report["departure"]["value"] == "scores"
    code, text, _ = compare(capsys, str(model), "--against", "torch:cpu:float64")
    assert f"Headline: line {line} of half_params_overflow.py" in text and "error inf x tolerance" in text
