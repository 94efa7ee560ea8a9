"""compareCandidate and validateCandidate through the wire: a planted candidate's headline names its line, a fix
is clean, a wrapper is refused, bad input is an error response in words and the session goes on serving."""

from pathlib import Path

import pytest

from tests.dap.wire import Debugger, refused

CANDIDATES = Path(__file__).parents[1] / "models" / "candidates"
REF = str(CANDIDATES / "reference.py")


def line_of(file: str, text: str) -> int:
    return next(i for i, line in enumerate((CANDIDATES / file).read_text().splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def server(schema):
    debugger = Debugger.spawn(schema)
    assert debugger.start(CANDIDATES / "norm_model.py", stopOnEntry=True)["reason"] == "entry"
    yield debugger
    debugger.close()


def test_compare_candidate_names_the_accumulator_line(server):
    mark = server.client.mark()
    report = server.request("compareCandidate", {"candidate": str(CANDIDATES / "blocked_attention.py"),
                                                 "function": "blocked_attention", "against": f"{REF}:sdpa_attention"})
    assert report["verdict"] == "departs"
    assert report["source"]["line"] == line_of("blocked_attention.py", "acc = acc + p @ vb")
    assert report["departure"]["value"] == "acc"
    events = [name for name, _ in server.client.events_since(mark) if name.startswith("progress")]
    assert events[0] == "progressStart" and events[-1] == "progressEnd"


@pytest.mark.parametrize("candidate, against, planted", [
    ("attention_refactor.py", "attention_model.py", "q = self.k_proj(x)"),
    ("norm_port.py", "norm_model.py", "normed = x * torch.rsqrt(power + self.eps)")])
def test_compare_candidate_names_a_model_refactors_line(server, candidate, against, planted):
    report = server.request("compareCandidate", {"candidate": str(CANDIDATES / candidate),
                                                 "against": str(CANDIDATES / against)})
    assert report["source"] == {"file": candidate, "line": line_of(candidate, planted), "text": planted}


def test_compare_candidate_says_a_fix_is_clean(server):
    report = server.request("compareCandidate", {"candidate": str(CANDIDATES / "layer_norm_fixed.py"),
                                                 "function": "layer_norm", "against": f"{REF}:layer_norm"})
    assert report["verdict"] == "clean" and report["headline"] is None


def test_compare_candidate_refuses_a_wrapper(server):
    report = server.request("compareCandidate", {"candidate": str(CANDIDATES / "wrapper_attention.py"),
                                                 "function": "tiled_attention", "against": f"{REF}:sdpa_attention"})
    assert report["verdict"] == "refused" and "wrapper-assisted, not a kernel" in report["reason"]


def test_validate_candidate_reports_every_case(server):
    report = server.request("validateCandidate", {"candidate": str(CANDIDATES / "layer_norm.py"),
                                                  "function": "layer_norm", "against": f"{REF}:layer_norm"})
    assert report["verdict"] == "rejected" and len(report["cases"]) > 10
    assert {"example", "dtype float16", "scale x8", "NaN in the last input"} <= {c["case"] for c in report["cases"]}


def test_bad_input_is_refused_in_words_and_the_session_goes_on(server):
    refused(server, "compareCandidate", {"candidate": str(CANDIDATES / "blocked_attention.py"),
                                         "function": "flash", "against": f"{REF}:sdpa_attention"},
            "defines no function 'flash'")
    refused(server, "compareCandidate", {"candidate": "nowhere.py", "against": REF}, "does not exist")
    refused(server, "compareCandidate", {"candidate": str(CANDIDATES / "norm_model.py")}, "missing required field")
    refused(server, "validateCandidate", {"candidate": str(CANDIDATES / "layer_norm.py"), "against": REF},
            "give 'function'")
    assert server.request("threads")["threads"]  # still serving
