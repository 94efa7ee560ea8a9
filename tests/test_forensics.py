"""Numerical forensics through the Session API: stops, localisation, patterns, reference kinds, ablation."""

import pytest
import torch

from checkpoint.branch import PrecisionPatch
from hardware.drivers import open_driver
from hardware.drivers.torch import TorchDriver
from hardware.errors import DriverError, RewindError
from hardware.session import Direction, LaunchOptions, Session
from provenance.ablation import ablate, search
from provenance.reference import save_values
from tests.conftest import EXAMPLES, MODELS, open_session, program
from tests.forensics_cases import CLEAN, FORENSICS, PLANTED, ids

NONFINITE = [c for c in PLANTED if c.nonfinite]
DIVERGING = [c for c in PLANTED if c.divergence]
FIXABLE = [c for c in PLANTED if c.precision_fixes]


def launched(path, **options) -> Session:
    session = Session()
    session.launch(LaunchOptions(str(path), driver="torch:cpu", budget_mb=64, **options), program=program(str(path)))
    return session


@pytest.mark.parametrize("case", NONFINITE, ids=ids(NONFINITE))
def test_nonfinite_stop_lands_on_the_planted_line_and_names_the_pattern(case):
    session = open_session(case.path)
    kind, node, pattern, marker = case.nonfinite
    session.set_exception_filters({kind})
    stop = session.start()
    assert stop.reason == "exception"
    d = stop.exception
    assert (d.filter, d.node) == (kind, node)
    assert d.source.endswith(f":{case.line(marker)}")
    assert session.tl.node_at(stop.tick - 1).name == node
    assert d.count > 0 and d.first_index is not None and d.inputs
    assert d.evidence["pattern"]["pattern"] == pattern


@pytest.mark.parametrize("case", DIVERGING, ids=ids(DIVERGING))
def test_divergence_stop_lands_on_the_node_that_introduced_the_error(case):
    session = open_session(case.path)
    node, pattern, marker = case.divergence
    session.set_exception_filters({"divergence"})
    stop = session.start()
    assert stop.reason == "exception" and stop.exception.filter == "divergence"
    d = stop.exception
    assert d.node == node and d.source.endswith(f":{case.line(marker)}")
    assert "diverges from the reference" in stop.description
    assert d.count == d.evidence["observed"]["mismatches"] > 0
    assert d.evidence["pattern"]["pattern"] == pattern
    assert d.evidence["pattern"]["fix"]


@pytest.mark.parametrize("path", CLEAN, ids=ids(CLEAN))
def test_clean_models_stop_nowhere_and_report_nothing(path):
    session = open_session(path)
    session.set_exception_filters({"nan", "divergence"})
    assert session.start().reason == "end"
    f = session.forensics
    assert f.first_nonfinite() is None  # gpt's -inf attention mask is written on purpose
    assert f.first_divergence() is None
    assert all(c.within for c in f.outputs())


def test_introduced_error_separates_the_culprit_from_the_nodes_that_inherit_it():
    session = open_session(FORENSICS / "cancellation.py")
    session.run()
    f = session.forensics
    by_name = {n.name: n for n in session.program.nodes}
    (culprit,) = f.introduced(by_name["rsub"])
    (victim,) = f.introduced(by_name["div"])
    (victim_observed,) = f.observed(by_name["div"])
    assert not culprit.within and victim.within and not victim_observed.within


def test_error_growth_follows_the_graph_to_the_outputs():
    session = open_session(FORENSICS / "softmax_overflow.py")
    found = session.forensics.first_divergence()
    assert [p["node"] for p in found.growth] == ["exp", "sum_1", "div", "matmul_1"]
    assert found.growth[-1]["value"] in session.program.outputs


def test_accumulated_error_is_found_where_it_crosses_tolerance_though_no_node_introduces_it():
    session = open_session(FORENSICS / "bf16_accumulation.py")
    found = session.forensics.first_divergence()
    assert found.introduced.within and not found.observed.within
    assert found.match.pattern.name == "low-precision-accumulation"
    assert all(p["node"].startswith("add") for p in found.growth)


def test_compare_table_has_a_row_per_floating_output_with_every_metric():
    session = open_session(FORENSICS / "mixed_precision.py")
    rows = session.forensics.table(introduced=True)
    assert len(rows) == len(session.program.nodes)  # one floating output each
    assert {"maxAbs", "maxRel", "rmse", "cosine", "mismatches", "firstMismatch", "rtol", "atol"} <= set(rows[0])
    assert all(r["within"] and r["introduced"]["within"] for r in rows)
    assert [r["tick"] for r in session.forensics.table(start=2, count=3)] == [2, 3, 4]


def test_reference_pass_runs_in_float64_and_makes_casts_down_no_ops():
    session = open_session(FORENSICS / "mixed_precision.py")
    ref = session.forensics.reference
    assert ref.value("_to_copy_1").dtype == torch.float64  # declared float16
    assert torch.equal(ref.value("_to_copy_1"), ref.value("softmax"))
    assert ref.value("p_qk_weight").dtype == torch.float64


def test_the_float64_reference_holds_no_widened_copy_of_the_weights_and_each_pass_shares_the_programs():
    """The weights are the Program's tensors in every pass (nothing writes them); the float64 pass widens a weight
    where a node reads it, and its reference still reads it as float64."""
    session = open_session(FORENSICS / "mixed_precision.py")
    ref = session.forensics.reference
    weight = session.program.initial["p_qk_weight"]
    for store in (session.tl.store, ref.timeline.store):
        held = store.initial["p_qk_weight"]
        assert held.dtype == weight.dtype and held.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    assert ref.value("p_qk_weight").dtype == torch.float64


def test_a_training_runs_parameters_are_the_drivers_own_copies():
    from hardware.frontends.torch_train import load_program as load_training
    program = load_training(MODELS / "training" / "mlp_sgd.py", "train_step", 2)
    loaded = TorchDriver.from_spec("torch:cpu").load(program)
    for buffer in program.buffer_mutations.values():
        assert loaded[buffer].untyped_storage().data_ptr() != program.initial[buffer].untyped_storage().data_ptr()


def test_reference_driver_spec_names_its_precision_and_refuses_others():
    assert open_driver("torch:cpu:float64").name == "torch:cpu:float64"
    with pytest.raises(DriverError, match="float64 or float32, not 'float16'"):
        open_driver("torch:cpu:float16")


def test_tolerances_are_configurable():
    loose = launched(FORENSICS / "cancellation.py", rtol=1.0)
    assert loose.forensics.first_divergence() is None
    with pytest.raises(RewindError, match="rtol must be a finite number"):
        launched(FORENSICS / "cancellation.py", rtol=-1.0).forensics.first_divergence()


def test_saved_reference_values_find_the_same_divergence(tmp_path):
    first = launched(FORENSICS / "cancellation.py")
    saved = tmp_path / "reference.pt"
    assert save_values(first.forensics.reference, str(saved)) == len(first.program.nodes)
    again = launched(FORENSICS / "cancellation.py", reference=str(saved))
    assert again.forensics.first_divergence().node.name == "rsub"


def test_a_trace_of_the_float64_pass_is_a_reference(tmp_path):
    trace = tmp_path / "reference.rwd"
    recorded = Session()
    recorded.launch(LaunchOptions(str(FORENSICS / "cancellation.py"), driver="torch:cpu:float64", record=str(trace)),
                    program=program(str(FORENSICS / "cancellation.py")))
    recorded.run()
    recorded.close()
    session = launched(FORENSICS / "cancellation.py", reference=str(trace))
    assert session.forensics.first_divergence().node.name == "rsub"


def test_a_reference_of_another_program_or_no_reference_at_all_is_a_clear_error(tmp_path):
    saved = tmp_path / "mlp.pt"
    save_values(launched(EXAMPLES / "mlp.py").forensics.reference, str(saved))
    with pytest.raises(RewindError, match="records another program"):
        launched(FORENSICS / "cancellation.py", reference=str(saved)).forensics.reference
    with pytest.raises(RewindError, match="neither a driver .* nor a file"):
        launched(FORENSICS / "cancellation.py", reference="float64 please").forensics.reference
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a reference")
    with pytest.raises(RewindError, match="cannot be read as saved values"):
        launched(FORENSICS / "cancellation.py", reference=str(junk)).forensics.reference


def test_unknown_exception_filters_are_named():
    session = open_session(EXAMPLES / "mlp.py")
    with pytest.raises(RewindError, match="unknown exception filter.*overflow.*known: nan, inf, divergence"):
        session.set_exception_filters({"overflow"})


@pytest.mark.parametrize("case", FIXABLE, ids=ids(FIXABLE))
def test_ablation_search_finds_nodes_whose_precision_brings_the_outputs_within_tolerance(case):
    session = open_session(case.path)
    session.run()
    result = search(session.forensics)
    assert result.found is not None and result.found.fixed, result.note
    assert not all(c.within for c in result.before) and all(c.within for c in result.found.after)
    assert len(result.found.nodes) < len(session.program.nodes)
    assert session.tl.nondeterminism == []


def test_precision_cannot_fix_a_nan_the_reference_has_too():
    session = open_session(FORENSICS / "masked_row.py")
    f = session.forensics
    found = f.with_reference(f.first_nonfinite())
    assert found.reference_agrees
    softmax = session.program.nodes[session.program.find_nodes("softmax")[0]]
    result = ablate(f, [softmax], "float64")
    assert all(c.nonfinite for c in result.after)


def test_ablation_restores_the_original_pass_bit_for_bit_under_a_tight_budget():
    session = open_session(FORENSICS / "softmax_overflow.py", budget_mb=0.0003, every=2)
    session.run()
    tl = session.tl
    session.goto(5)
    before = {name: tl.value(name, tl.end).clone() for name, info in session.program.values.items()
              if info.producer is not None}
    log_before = [r.digest for r in tl.log]
    result = search(session.forensics)
    assert result.found.fixed and tl.ring.evictions > 0
    assert tl.position == 5 and tl.frontier == tl.end and tl.patches == {}
    assert [r.digest for r in tl.log] == log_before
    for name, tensor in before.items():
        again = tl.value(name, tl.end)
        assert again.dtype == tensor.dtype and torch.equal(again.nan_to_num(), tensor.nan_to_num()), name
    assert tl.nondeterminism == []


def test_a_branch_runs_patched_nodes_wider_and_casts_back_for_the_others():
    session = open_session(FORENSICS / "softmax_overflow.py")
    session.run()
    tl = session.tl
    exp = session.program.find_nodes("exp")[0]
    branch = tl.branch([PrecisionPatch(exp, "float32")])
    tl.seek(tl.end)
    assert tl.value("exp").dtype == torch.float32 and tl.value("sum_1").dtype == torch.float16
    tl.unbranch(branch)
    assert tl.value("exp").dtype == torch.float16
    with pytest.raises(RewindError, match="innermost first"):
        tl.unbranch(branch)


def test_forensics_runs_on_the_sim_chip_against_the_float64_reference():
    session = open_session(FORENSICS / "sqrt_domain.py", driver="sim")
    session.set_exception_filters({"nan"})
    stop = session.start()
    assert stop.exception.node == "sqrt" and stop.exception.evidence["pattern"]["pattern"] == "outside-domain"
    assert session.forensics.first_divergence().node.name == "sub"


def test_a_nan_made_from_an_inherited_infinity_names_where_the_infinity_was_born():
    case = next(c for c in PLANTED if c.model == "softmax_overflow")
    session = open_session(case.path)
    session.set_exception_filters({"nan"})
    stop = session.start()
    evidence = stop.exception.evidence
    assert stop.exception.node == "div" and evidence["pattern"]["pattern"] == "inf-arithmetic"
    assert evidence["origin"]["node"] == "exp" and evidence["origin"]["source"].endswith(f":{case.line('# BUG')}")


def test_reverse_continue_with_the_divergence_filter_comes_back_to_the_culprit():
    session = open_session(FORENSICS / "cancellation.py")
    session.run()
    session.set_exception_filters({"divergence"})
    stop = session.run(Direction.REVERSE)
    assert stop.reason == "exception" and session.tl.node_at(stop.tick - 1).name == "rsub"
