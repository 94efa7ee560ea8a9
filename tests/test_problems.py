"""Problems of a run as an editor shows them: the node that introduced a NaN/Inf or left the
reference, with the values and the failure pattern; intended infinities are not problems."""

from __future__ import annotations

from provenance.problems import collect
from tests.conftest import EXAMPLES, MODELS, line_of, open_session

GPT = EXAMPLES / "gpt.py"
NONFINITE = MODELS / "nonfinite.py"
CANCELLATION = MODELS / "forensics" / "cancellation.py"


def _problems(path, entry="build"):
    return collect(open_session(path, entry=entry))


def test_overflow_to_inf_is_one_error_at_the_exp_line_naming_the_exponent_and_the_fix():
    (problem,) = _problems(NONFINITE, "overflow")  # also a divergence, reported once
    assert (problem.kind, problem.severity, problem.node, problem.tick) == ("inf", "error", "exp", 1)
    assert problem.frames[-1].loc.line == line_of(NONFINITE, "gain = torch.exp(x * 100)")
    assert problem.message.startswith("first Inf: aten.exp.default 'exp' wrote 'exp' (float32[2, 2]) at tick 1 "
                                      "with 2 Inf, first at [0, 1] (mul = 100); exp/softmax overflow")
    assert "the largest exponent is 200 but exp overflows float32 above 88.72" in problem.message
    assert "Fix: subtract the row max before exponentiating" in problem.message


def test_log_of_a_negative_number_names_the_operand_by_its_source_name():
    (problem,) = _problems(NONFINITE, "logarithm")
    assert problem.kind == "nan" and problem.node == "log"
    assert "first at [1] (shifted (sub) = -0.5); log or sqrt outside the domain" in problem.message


def test_catastrophic_cancellation_is_the_first_divergence_with_its_error_and_growth():
    (problem,) = _problems(CANCELLATION)  # the rounding it amplifies is on the same line: one problem
    assert (problem.kind, problem.node) == ("divergence", "rsub")
    assert problem.frames[-1].loc.line == line_of(CANCELLATION, "bend = 1 - torch.cos(angle)")
    assert problem.message.startswith("first divergence from the reference (torch:cpu:float64): aten.rsub.Scalar "
                                      "'rsub' wrote 'rsub' (float32[4, 8]) at tick 1 with 32 of 32 elements beyond")
    assert "it introduced the error itself" in problem.message and "at the outputs it is" in problem.message
    assert "catastrophic cancellation: operands up to 1 cancel" in problem.message
    line = line_of(CANCELLATION, "bend = 1 - torch.cos(angle)")
    assert f"root cause upstream: error introduced at cancellation.py:{line} by `cos`" in problem.message


def test_a_random_op_is_reported_as_nondeterminism_not_also_as_a_divergence():
    (problem,) = _problems(EXAMPLES / "noisy.py")
    assert (problem.kind, problem.severity, problem.node) == ("nondeterminism", "warning", "randn_like")


def test_an_attention_mask_filled_with_minus_inf_is_not_a_problem():
    assert _problems(GPT) == []


def test_a_dropped_barrier_is_a_race_at_the_line_of_the_node_naming_both_accesses():
    faults = [{"kind": "drop_barrier", "node": "layer_norm_1", "unit": "core 2"}]
    (problem,) = collect(open_session(GPT, driver="sim", faults=faults))
    assert (problem.kind, problem.severity, problem.node) == ("race", "error", "layer_norm_1")
    assert problem.frames[-1].loc.line == line_of(GPT, "x = x + self.mlp(self.ln2(x))")
    assert problem.message.startswith("race on 'partial sums of layer_norm_1' [0x")
    assert "are not ordered by any barrier, semaphore or DMA wait" in problem.message


def test_a_miscounted_barrier_is_a_hang_with_its_wait_for_graph():
    session = open_session(GPT, driver="sim", faults=[{"kind": "miscount_barrier", "node": "softmax_1"}])
    session.goto(session.end)
    (problem,) = collect(session)
    assert (problem.kind, problem.node) == ("hang", "softmax_1")
    assert problem.message.startswith("hang in node 'softmax_1' at ") and "every live unit is blocked" in problem.message
    assert session.position == session.end and session.exception_filters == set()  # left as it was
