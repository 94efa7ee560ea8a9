"""The comparison from the console (`compare-with`, through the server's compareCandidate and validateCandidate)
and from the Python API (`s.compare_with(...)`): the same report as `rewind compare`, the headline on its line."""

import json
from pathlib import Path

import pytest

import rewind
from hardware.errors import RewindError
from tests.dap.wire import rewind as rewind_command

CANDIDATES = Path(__file__).parent / "models" / "candidates"
REF = CANDIDATES / "reference.py"


def line_of(file: str, text: str) -> int:
    return next(i for i, line in enumerate((CANDIDATES / file).read_text().splitlines(), 1) if text in line)


def test_the_console_compares_and_validates_a_candidate(tmp_path):
    script = tmp_path / "compare.rewind"
    script.write_text(f"compare-with {CANDIDATES / 'blocked_attention.py'} --function blocked_attention "
                      f"--against {REF}:sdpa_attention\n"
                      f"compare-with {CANDIDATES / 'layer_norm_fixed.py'} --function layer_norm --against "
                      f"{REF}:layer_norm --validate\n"
                      f"compare-with {CANDIDATES / 'layer_norm.py'} --function nothing --against {REF}\n"
                      "compare-with\nquit\n")
    run = rewind_command("debug", str(CANDIDATES / "norm_model.py"), "--driver", "torch:cpu", "--json", "-x",
                         str(script))
    records = [r for r in map(json.loads, run.stdout.splitlines()) if r["command"].startswith("compare-with")]
    compared, validated, missing, bare = records[:4]
    assert compared["ok"] and compared["result"]["source"]["line"] == line_of("blocked_attention.py",
                                                                             "acc = acc + p @ vb")
    assert validated["ok"] and validated["result"]["verdict"] == "validated"
    assert not missing["ok"] and "defines no function 'nothing'" in missing["error"]
    assert not bare["ok"] and "compare-with" in bare["error"]


def test_the_console_text_is_the_commands_report(tmp_path):
    script = tmp_path / "compare.rewind"
    script.write_text(f"compare-with {CANDIDATES / 'norm_port.py'} --against {CANDIDATES / 'norm_model.py'}\nquit\n")
    run = rewind_command("debug", str(CANDIDATES / "norm_model.py"), "--driver", "torch:cpu", "-x", str(script))
    line = line_of("norm_port.py", "torch.rsqrt(power + self.eps)")
    assert f"Headline: line {line} of norm_port.py" in run.stdout


@pytest.fixture(scope="module")
def session():
    with rewind.debug(CANDIDATES / "attention_refactor.py", driver="torch:cpu") as s:
        yield s


def test_compare_with_takes_the_sessions_model_as_the_candidate(session):
    answer = session.compare_with(CANDIDATES / "attention_model.py")
    assert answer.data["verdict"] == "departs"
    assert answer.data["source"]["line"] == line_of("attention_refactor.py", "q = self.k_proj(x)")
    assert f"Headline: line {answer.data['source']['line']} of attention_refactor.py" in repr(answer)


def test_compare_with_a_function_and_its_validation(session):
    answer = session.compare_with(f"{REF}:sdpa_attention", candidate=CANDIDATES / "tail_block.py",
                                  function="tail_attention")
    assert answer.data["departure"]["how"] == "tail"
    validated = session.compare_with(f"{REF}:sdpa_attention", candidate=CANDIDATES / "tail_block_fixed.py",
                                     function="tail_attention", validate=True)
    assert validated.data["verdict"] == "validated" and "Verdict: validated" in repr(validated)


def test_compare_with_bad_input_is_said_in_words(session):
    with pytest.raises(RewindError, match="does not exist"):
        session.compare_with(CANDIDATES / "missing.py")
    with pytest.raises(RewindError, match="validate must be True or False"):
        session.compare_with(CANDIDATES / "attention_model.py", validate="yes")
