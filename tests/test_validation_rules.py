"""The rules no masking fix can pass (provenance/validation.py), through the repair loop and the Validator:
a NaN replaced downstream is masked, not fixed; where the float64 reference is NaN/Inf the fixed program at
float64 judges; a float64 band-aid fails at 8 times the example's range; a patch returning another dtype is
refused by name; the knowledge base keeps rejections and never ranks a rejected kind up again."""

import json
import math

import pytest

from hardware.errors import RewindError
from hardware.frontends.torch_export import export_program, load_module
from provenance.inputs import InputPlan
from provenance.knowledge import KnowledgeBase
from provenance.repair import FixText, RepairLoop
from provenance.validation import Validator
from tests.conftest import MODELS, open_session, program
from tests.forensics_cases import FORENSICS

FIXES = MODELS / "fixes"
RMS = MODELS / "repair" / "rms_norm_no_eps.py"
LOG_SOFTMAX = FORENSICS / "log_of_softmax.py"
SMALL = InputPlan(seeds=1, scales=(8.0,), shapes=0)


def fix(name: str) -> FixText:
    path = FIXES / name
    return FixText(path.read_text(), str(path))


@pytest.fixture(scope="module")
def rms_with_bias():
    return open_session(RMS, budget_mb=64, entry="build_with_bias")


@pytest.fixture(scope="module")
def log_of_softmax():
    return open_session(LOG_SOFTMAX, budget_mb=64)


@pytest.fixture
def knowledge(tmp_path) -> KnowledgeBase:
    return KnowledgeBase(tmp_path / "fixes.json")


@pytest.mark.parametrize("entry", ["build", "build_with_bias"])
def test_nan_replaced_by_zero_at_the_output_is_masked_not_fixed_and_the_epsilon_validates(entry, knowledge):
    """Zero is even the right value without a bias: the fix is still rejected, for hiding the NaN."""
    session = open_session(RMS, budget_mb=64, entry=entry)
    report = RepairLoop(session, knowledge, plan=SMALL).run([fix("nan_to_zero.py"), fix("rms_epsilon.py")],
                                                           suggest=False)
    masked, epsilon = report["attempts"]
    assert masked["verdict"] == "rejected" and masked["reason"].startswith("masked, not fixed: inf born at rsqrt")
    assert masked["reason"].endswith("(on example, seed 1, range x8)")
    first = masked["validation"]["checks"][0]["unfixed"][0]
    assert (first["born"]["node"], first["born"]["kind"], first["born"]["count"]) == ("rsqrt", "inf", 1)
    assert [n["node"] for n in first["maskedBy"]] == ["add"] and first["inReference"]
    assert epsilon["verdict"] == "validated" and report["fix"]["name"] == "rms_epsilon.py"
    for check in epsilon["validation"]["checks"]:  # the padding row: NaN in the reference, judged by the fix at f64
        assert check["fixedReference"] and check["outputs"][0]["fixedReferenceElements"] == 8 and not check["births"]
    assert report["knowledge"]["rejected"] == [{"pattern": "division-by-zero", "name": "nan_to_zero.py",
                                                "rejections": 1, "rejectedFor": ["masked, not fixed"]}]


def test_a_rejected_kind_recorded_by_an_older_version_is_never_suggested_above_one_that_validated(
        rms_with_bias, knowledge):
    """A cache written before these rules holds the masking fix as validated three times, without the newer
    fields: it loads, is tried first, is rejected, and from then on comes after the built-in epsilon."""
    finding = rms_with_bias.forensics.first_nonfinite()
    RepairLoop(rms_with_bias, knowledge, plan=SMALL).run([fix("nan_to_zero.py")], suggest=False)
    saved = json.loads(knowledge.path.read_text())
    (old,) = saved["fixes"]
    old = {k: old[k] for k in ("pattern", "name", "origin", "patches", "programs", "inputs")} | {"validations": 3}
    knowledge.path.write_text(json.dumps({"format": saved["format"], "fixes": [old]}))
    older = KnowledgeBase(knowledge.path)
    assert [c.name for c in older.suggest(finding, rms_with_bias.forensics)][0] == "nan_to_zero.py"
    report = RepairLoop(rms_with_bias, older, plan=SMALL).run([], suggest=True)
    assert [a["candidate"]["name"] for a in report["attempts"]] == ["nan_to_zero.py",
                                                                     "rsqrt_with_epsilon in place of rsqrt"]
    assert report["verdict"] == "validated"
    names = [c.name for c in KnowledgeBase(knowledge.path).suggest(finding, rms_with_bias.forensics)]
    assert names.index("rsqrt_with_epsilon in place of rsqrt") < names.index("nan_to_zero.py")


def test_a_float64_band_aid_for_log_of_softmax_fails_at_eight_times_the_range_and_log_softmax_passes(
        log_of_softmax, knowledge):
    report = RepairLoop(log_of_softmax, knowledge, plan=InputPlan(seeds=0, shapes=0)).run(
        [fix("softmax_in_float64.py")], suggest=True)
    band_aid, suggested = report["attempts"]
    assert band_aid["validation"]["failed"] == ["range x8"]  # a default scale
    assert band_aid["reason"].startswith("not fixed: inf born at log") and "reaches the outputs" in band_aid["reason"]
    assert suggested["candidate"]["name"] == "log_softmax_for_softmax in place of softmax, log"
    assert suggested["verdict"] == "validated" and report["verdict"] == "validated"
    at_eight = suggested["validation"]["checks"][-1]
    assert at_eight["inputs"]["name"] == "range x8" and at_eight["outputs"][0]["fixedReferenceElements"] > 0
    names = [c.name for c in KnowledgeBase(knowledge.path).suggest(log_of_softmax.forensics.first_nonfinite(),
                                                                   log_of_softmax.forensics)]
    assert names.index("log_softmax_for_softmax in place of softmax, log") < names.index("log_clamped in place of log")


def test_an_intended_absorbed_infinity_is_kept_but_one_of_the_same_op_reaching_the_outputs_is_not(tmp_path,
                                                                                                   knowledge):
    """T5's position buckets take log(0) = -inf on purpose and discard it; the leaky model's second log
    sends its own -inf to the output. Clamping that log's argument keeps the first, and validates; running
    it at float64 leaves the second, which the first (the same op, in the same module) does not excuse."""
    session = open_session(FORENSICS / "absorbed_log.py", budget_mb=64, entry="leaky")
    clamp = ("import torch\n\n\ndef log_above_zero(x):\n    return torch.log(x.clamp_min(1e-30))\n\n\n"
             "PATCHES = {'log_1': log_above_zero}\n")
    fixes = [FixText("PATCHES = {'log_1': 'float64'}\n", str(tmp_path / "wide.py")),
             FixText(clamp, str(tmp_path / "clamp.py"))]
    report = RepairLoop(session, knowledge, plan=InputPlan(seeds=0, scales=(), shapes=0)).run(fixes, suggest=False)
    wide, clamped = report["attempts"]
    (unfixed,) = wide["validation"]["checks"][0]["unfixed"]
    assert unfixed["born"]["node"] == "log_1" and unfixed["verdict"] == "not fixed" and unfixed["inReference"]
    assert clamped["verdict"] == "validated"
    (kept,) = clamped["validation"]["checks"][0]["births"]
    assert kept["node"] == "log" and [n["node"] for n in kept["absorbedAt"]] == ["_to_copy_1"]


def test_a_patch_returning_another_dtype_is_refused_naming_the_node_and_both_dtypes(log_of_softmax, knowledge):
    report = RepairLoop(log_of_softmax, knowledge, plan=InputPlan(seeds=0, scales=(), shapes=0)).run(
        [fix("softmax_returns_float64.py")], suggest=False)
    (attempt,) = report["attempts"]
    (check,) = attempt["validation"]["checks"]
    assert check["dtypeMismatch"] == {"node": "softmax", "op": "aten.softmax.int", "value": "softmax",
                                      "recorded": "float32", "returned": "float64"}
    assert "returned 'softmax' as float64, but the pass stores it as float32" in attempt["reason"]
    assert check["referenceBirths"] is None
    assert check["referenceBirthsReason"] == "the fixed pass failed before the reference was read"
    assert report["knowledge"]["rejected"][0]["rejectedFor"] == ["a patched node returned another dtype"]


def test_where_the_float64_reference_cancels_the_right_fix_is_judged_by_itself_at_float64(knowledge):
    """log(1 - sigmoid(34.4)) keeps 6% of its digits in float64: its float32 twin is -inf there, so the
    reference is in doubt and logsigmoid(-z), right to float32's precision, is judged by itself at float64."""
    session = open_session(FORENSICS / "log_domain.py", budget_mb=64)
    report = RepairLoop(session, knowledge, plan=InputPlan(seeds=2, scales=(), shapes=0)).run([], suggest=True)
    first = report["attempts"][0]
    assert first["candidate"]["name"] == "log_sigmoid_of_negated in place of sigmoid, rsub, log"
    assert first["verdict"] == "validated"
    doubted = [c["outputs"][0]["doubtfulReferenceElements"] for c in first["validation"]["checks"]]
    assert doubted[2] > 0  # seed 2 draws a logit in the band where float64 cancels


def test_validate_program_judges_an_edited_model_by_the_same_rules(rms_with_bias):
    validator = Validator(rms_with_bias, InputPlan(seeds=0, scales=(8.0,), shapes=0))

    def edited(entry):
        module, _ = load_module(RMS, entry)
        return lambda inputs: export_program(module, (inputs.program.initial["x"],), entry)

    def unexportable(inputs):
        raise RewindError("the edited model does not export")

    fixed = validator.validate_program(edited("build_with_epsilon"), math.inf)
    assert fixed.passed and [c.outputs[0]["fixedReferenceElements"] for c in fixed.checks] == [8, 8]
    masked = validator.validate_program(edited("build_masked"), math.inf)
    assert not masked.passed and masked.rules == ["masked, not fixed"]
    assert masked.checks[0].unfixed[0]["maskedBy"][0]["op"] == "aten.nan_to_num.default"
    broken = validator.validate_program(unexportable, math.inf)
    assert [c.error for c in broken.checks] == ["the edited model does not export"] * 2
    other = validator.validate_program(lambda inputs: program(str(LOG_SOFTMAX)), math.inf)
    assert other.checks[0].error == ("the fixed program's output 'log' is float32[3, 8]; the original's 'add' is "
                                     "float32[4, 8]")


def test_knowledge_base_entries_of_older_files_load_and_damaged_ones_are_refused_in_words(tmp_path):
    path = tmp_path / "fixes.json"
    patch = {"op": "aten.exp.default", "hops": 0, "node": "exp", "kind": "precision", "dtype": "float32"}
    old = {"pattern": "exp-overflow", "name": "wide.py", "origin": "fix", "patches": [patch], "validations": 2,
           "programs": ["m"], "inputs": ["example", "seed 1"]}
    path.write_text(json.dumps({"format": "rewind-fixes/1", "fixes": [old]}))
    (entry,) = KnowledgeBase(path).fixes
    assert (entry["rejections"], entry["rejectedFor"], entry["inputSetsPassed"]) == (0, [], 4)
    damaged = {"entry 1 has no valid 'validations'": {**old, "validations": "2"},
               "'rejections' must be a count >= 0": {**old, "rejections": -1},
               "'rejectedFor' must be a list of names": {**old, "rejectedFor": "masked"},
               "not a precision, attributes or function patch": {**old, "patches": [{**patch, "kind": "edit"}]},
               "precision patch without a valid 'dtype'": {**old, "patches": [{**patch, "dtype": 32}]},
               "whose 'hops' is not a whole number": {**old, "patches": [{**patch, "hops": "0"}]},
               "entry 1 is not a recorded fix": ["exp-overflow"]}
    for message, bad in damaged.items():
        path.write_text(json.dumps({"format": "rewind-fixes/1", "fixes": [bad]}))
        with pytest.raises(RewindError, match=message):
            KnowledgeBase(path)
