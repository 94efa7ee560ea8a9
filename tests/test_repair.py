"""The repair loop through the Session API: the knowledge base's suggestions validate on every planted bug,
wrong fixes are rejected with evidence, fixes that fetch the reference are refused, validated fixes are
recorded and suggested for new findings, and the generated inputs the engine validates on."""

import json
import math

import pytest
import torch

from checkpoint.branch import FunctionPatch
from hardware.errors import RewindError
from provenance.fixes import Candidate
from provenance.inputs import InputPlan, input_sets
from provenance.integrity import CallAudit
from provenance.knowledge import KnowledgeBase
from provenance.reference import save_values
from provenance.repair import FixText, RepairLimits, RepairLoop
from provenance.validation import Validator, certify
from tests.conftest import EXAMPLES, MODELS, fresh_module, open_session, program
from tests.forensics_cases import FORENSICS, PLANTED, ids

FIXES = MODELS / "fixes"
GATED = MODELS / "repair" / "gated_experts.py"


def fix(name: str) -> FixText:
    path = FIXES / name
    return FixText(path.read_text(), str(path))


def repair(path, knowledge, fixes=(), suggest=None, **limits) -> dict:
    loop = RepairLoop(open_session(path, budget_mb=64), knowledge, RepairLimits(**limits))
    return loop.run(list(fixes), suggest=not fixes if suggest is None else suggest)


@pytest.fixture
def knowledge(tmp_path) -> KnowledgeBase:
    return KnowledgeBase(tmp_path / "fixes.json")


@pytest.mark.parametrize("case", PLANTED, ids=ids(PLANTED))
def test_the_knowledge_bases_suggested_fix_validates_on_each_planted_bug(case, knowledge):
    report = repair(case.path, knowledge)
    assert report["verdict"] == "validated", report["reason"]
    last = report["attempts"][-1]
    checks = last["validation"]["checks"]
    assert [c["inputs"]["name"] for c in checks][:7] == ["example", "seed 1", "seed 2", "range x0.125", "range x0.5",
                                                         "range x2", "range x8"]
    assert checks[-1]["inputs"]["kind"] == "shape"
    assert all(c["within"] and all(o["within"] for o in c["outputs"]) for c in checks)
    assert all(a["verdict"] == "rejected" and a["validation"]["failed"] for a in report["attempts"][:-1])
    recorded = report["knowledge"]["recorded"]
    assert recorded["pattern"] == report["findings"][0]["pattern"]["pattern"] and recorded["validations"] == 1
    assert [t["state"] for t in report["transitions"]][:4] == ["forensics", "candidate", "integrity", "validation"]


def test_a_recorded_fix_is_suggested_first_for_a_new_finding_of_its_pattern(knowledge):
    first = repair(FORENSICS / "softmax_overflow.py", knowledge, [fix("stable_softmax.py")])
    assert first["verdict"] == "validated" and first["knowledge"]["recorded"]["name"] == "stable_softmax.py"
    entry = KnowledgeBase(knowledge.path).fixes[0]  # read back from the file
    assert entry["pattern"] == "exp-overflow" and entry["patches"][0]["hops"] == 0
    again = repair(GATED, knowledge)  # another program, the same pattern
    (attempt,) = again["attempts"]
    assert attempt["candidate"]["origin"] == "learned" and attempt["candidate"]["name"] == "stable_softmax.py"
    assert attempt["verdict"] == "validated" and again["knowledge"]["recorded"]["validations"] == 2


def test_a_recorded_fix_whose_source_the_integrity_check_refuses_is_not_suggested(knowledge):
    repair(FORENSICS / "softmax_overflow.py", knowledge, [fix("stable_softmax.py")])
    saved = json.loads(knowledge.path.read_text())
    saved["fixes"][0]["patches"][0]["text"] = "import gc\n" + saved["fixes"][0]["patches"][0]["text"]
    knowledge.path.write_text(json.dumps(saved))
    session = open_session(GATED, budget_mb=64)
    finding = session.forensics.first_nonfinite()
    first = next(KnowledgeBase(knowledge.path).suggest(finding, session.forensics))
    assert first.origin == "built-in"


def test_a_wrong_fix_is_rejected_with_the_inputs_and_errors_as_evidence(knowledge):
    report = repair(FORENSICS / "rsqrt_no_epsilon.py", knowledge, [fix("large_epsilon.py")])
    assert report["verdict"] == "rejected" and report["knowledge"]["recorded"] is None
    (attempt,) = report["attempts"]
    assert attempt["integrity"]["passed"] and attempt["candidate"]["patches"][0]["kind"] == "function"
    example = attempt["validation"]["checks"][0]
    assert example["inputs"]["name"] == "example" and example["inputs"]["inputs"]["x"]["shape"] == [4, 16]
    (out,) = example["outputs"]
    assert not out["within"] and out["error"] > 1 and out["mismatches"] > 0
    assert out["firstMismatch"][0] == 2  # the nearly constant row the epsilon swamps
    assert attempt["reason"].startswith("outputs beyond tolerance of the reference (on example")
    (entry,) = KnowledgeBase(knowledge.path).fixes  # recorded as rejected, never as a fix
    assert (entry["validations"], entry["rejections"]) == (0, 1)
    assert entry["rejectedFor"] == ["outputs beyond tolerance of the reference"]


def test_a_fix_that_copies_the_reference_is_refused_before_it_runs(knowledge):
    report = repair(FORENSICS / "softmax_overflow.py", knowledge, [fix("copies_reference.py")])
    (attempt,) = report["attempts"]
    assert report["verdict"] == "rejected" and attempt["validation"] is None
    assert attempt["reason"] == "the integrity check refused the fix"
    assert {"check": "source", "what": "imports gc", "line": 4} == {k: attempt["integrity"]["violations"][0][k]
                                                                     for k in ("check", "what", "line")}


def test_a_fix_that_loads_a_saved_reference_is_refused_while_it_runs(knowledge, tmp_path):
    session = open_session(FORENSICS / "softmax_overflow.py", budget_mb=64)
    saved = tmp_path / "reference.pt"
    save_values(session.forensics.reference, str(saved))
    text = ("import torch\n\n\ndef weights(numerators, denominators):\n"
            "    fetch = getattr(torch, 'lo' + 'ad')  # past the source check\n"
            f"    return fetch({str(saved)!r})['values']['div'].to(numerators.dtype)\n\n\n"
            "PATCHES = {'div': weights}\n")
    report = RepairLoop(session, knowledge).run([FixText(text, str(tmp_path / "sneaky.py"))], suggest=False)
    (attempt,) = report["attempts"]
    (violation,) = attempt["integrity"]["violations"]
    assert violation["check"] == "call" and "torch/serialization.py" in violation["what"] and violation["line"] == 6
    assert attempt["validation"]["stopped"] == "the integrity check refused the fix"
    assert report["verdict"] == "rejected"


def test_calls_into_the_reference_or_the_programs_own_code_are_refused_by_the_audit():
    path = FORENSICS / "softmax_overflow.py"
    session = open_session(path, budget_mb=64)
    reference = session.forensics.reference
    model_file = fresh_module(path)
    model, _ = model_file.build()
    x = session.program.initial["x"]  # read here: the cheat below calls only the program's own code
    div = session.program.find_nodes("div")[0]
    validator = Validator(session, InputPlan(seeds=0, scales=(), shapes=0))

    def copies(numerators, denominators):
        return reference.value("div").to(numerators.dtype)

    def reruns(numerators, denominators):
        model(x)
        return numerators / denominators

    for cheat, refusal in ((copies, "calls the engine: Reference.value"), (reruns, "calls the program's own code")):
        audit = CallAudit([__file__], session.program.source_files)
        result = validator.validate(Candidate(cheat.__name__, "fix", [FunctionPatch(div, cheat)]).guarded(audit),
                                    math.inf)
        assert not result.passed and result.checks[0].error.startswith("integrity:")
        assert refusal in audit.violations[0].what and audit.violations[0].file == __file__


def test_limits_bound_the_attempts_and_the_time(knowledge):
    fixes = [fix("large_epsilon.py"), fix("large_epsilon.py")]
    by_count = repair(FORENSICS / "rsqrt_no_epsilon.py", knowledge, fixes, attempts=1)
    assert by_count["verdict"] == "exhausted" and len(by_count["attempts"]) == 1
    assert "limit of 1 attempts" in by_count["reason"]
    by_time = repair(FORENSICS / "rsqrt_no_epsilon.py", knowledge, fixes, seconds=1e-6)
    assert by_time["verdict"] == "exhausted" and "time limit" in by_time["reason"] and not by_time["attempts"]
    with pytest.raises(RewindError, match="at least 1 attempt"):
        RepairLimits(attempts=0)


def test_a_clean_pass_has_nothing_to_repair_and_a_fix_of_it_is_validated_not_recorded(knowledge, tmp_path):
    clean = FORENSICS / "clean_half.py"
    assert repair(clean, knowledge)["verdict"] == "clean"
    text = "PATCHES = {'aten.layer_norm': {'eps': 2e-5}}\n"
    report = repair(clean, knowledge, [FixText(text, str(tmp_path / "eps.py"))])
    assert report["verdict"] == "validated" and report["knowledge"]["recorded"] is None
    assert report["fix"]["patches"][0]["attributes"] == {"eps": 2e-5}


def test_bad_fix_files_get_errors_naming_the_problem(knowledge, tmp_path):
    cases = {"PATCHES = {'nope': 'float32'}\n": "no node, op or module path 'nope'",
             "X = 1\n": "must define PATCHES",
             "PATCHES = {'exp': 3}\n": "must be a function, a dtype or a dict of attributes",
             "PATCHES = {'exp': lambda x: x}\n": "defined at the top level",
             "def (:\n": "invalid syntax"}
    for text, error in cases.items():
        report = repair(FORENSICS / "softmax_overflow.py", knowledge, [FixText(text, str(tmp_path / "bad.py"))])
        assert report["verdict"] == "rejected" and error in report["attempts"][0]["reason"] + str(
            report["attempts"][0]["integrity"]), text


def test_generated_inputs_keep_row_statistics_masks_and_token_ranges():
    masked = program(str(FORENSICS / "masked_row.py"))
    sets, skipped = input_sets(masked, InputPlan(), str(FORENSICS / "masked_row.py"))
    assert [s.name for s in sets][:7] == ["example", "seed 1", "seed 2", "range x0.125", "range x0.5", "range x2",
                                          "range x8"] and not skipped
    example = masked.initial
    for s in sets[1:7]:
        assert torch.equal(s.program.initial["allowed"], example["allowed"])  # a mask is structure, not data
        assert not torch.equal(s.program.initial["x"], example["x"])
    assert torch.equal(sets[6].program.initial["x"], example["x"] * 8)
    shape = sets[7]
    assert shape.kind == "shape" and "re-exported" in shape.note
    assert shape.program.values["x"].shape == (10, 8) and shape.program.values["allowed"].shape == (10, 10)
    norm = program(str(FORENSICS / "rsqrt_no_epsilon.py"))
    seeded = input_sets(norm, InputPlan(shapes=0))[0][1].program.initial["x"].double()
    assert seeded[2].std() < 1e-3 < seeded[0].std()  # the nearly constant row stays nearly constant
    tokens = program(str(EXAMPLES / "gpt.py"))
    ids = input_sets(tokens, InputPlan(seeds=1, scales=(), shapes=0))[0][1].program.initial["tokens"]
    original = tokens.initial["tokens"]
    assert ids.dtype == original.dtype and original.min() <= ids.min() and ids.max() <= original.max()


def test_shapes_the_program_cannot_take_are_skipped_with_the_reason():
    gpt = str(EXAMPLES / "gpt.py")
    sets, skipped = input_sets(program(gpt), InputPlan(seeds=0, scales=(), shapes=2), gpt)
    assert [s.program.values["tokens"].shape for s in sets[1:]] == [(2, 16)]
    assert any(why.startswith("shapes tokens[1, 32]: the program does not export") for why in skipped)
    assert input_sets(program(gpt), InputPlan(seeds=0, scales=()))[1] == [
        "shapes: no model file to export again (a trace or a program given directly)"]


def test_other_inputs_for_the_same_program_must_match_its_exported_shapes():
    p = program(str(FORENSICS / "softmax_overflow.py"))
    with pytest.raises(RewindError, match=r"'x' must be float16\[1, 8, 16\] as exported, got float32\[1, 8, 16\]"):
        p.with_inputs({"x": torch.zeros(1, 8, 16)})
    with pytest.raises(RewindError, match="'p_key_weight' is not an input .*its inputs: x"):
        p.with_inputs({"p_key_weight": torch.zeros(16, 16)})


def test_certification_needs_the_reference_where_it_is_finite_and_no_nan_anywhere():
    ref = torch.tensor([1.0, math.nan, -math.inf, 2.0], dtype=torch.float64)
    repaired = certify("y", "float32", torch.tensor([1.0, 0.0, -math.inf, 2.0]), ref, 1e-4, 0.0)
    assert repaired["within"] and repaired["nonfiniteLeft"] == 0
    still_nan = certify("y", "float32", torch.tensor([1.0, math.nan, -math.inf, 2.0]), ref, 1e-4, 0.0)
    assert not still_nan["within"] and still_nan["nonfiniteLeft"] == 1
    off = certify("y", "float32", torch.tensor([1.0, 0.0, -math.inf, 2.1]), ref, 1e-4, 0.0)
    assert not off["within"] and off["firstMismatch"] == [3]


def test_two_sessions_recording_into_one_knowledge_base_keep_each_others_validations(tmp_path):
    """Each session read the file before the other recorded; the second to record must not write back its
    stale copy over the first's fix."""
    first, second = KnowledgeBase(tmp_path / "fixes.json"), KnowledgeBase(tmp_path / "fixes.json")
    for kb in (first, second):
        assert repair(FORENSICS / "softmax_overflow.py", kb, [fix("stable_softmax.py")])["verdict"] == "validated"
    (entry,) = KnowledgeBase(tmp_path / "fixes.json").fixes
    assert entry["validations"] == 2
    assert not list(tmp_path.glob("*.tmp"))
