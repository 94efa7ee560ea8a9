"""The expression language against expressions that cost too much, nest too deep or fail inside torch.

Every limit is checked before the operation runs (a refused expression answers at once, whatever it
would have cost), errors say what was refused in the user's words without Python's exception names,
and a running evaluation stops between two operations when asked.
"""

from __future__ import annotations

import builtins
import math
import re
import threading
import time

import pytest
import torch

from hardware.errors import ExpressionError
from hardware.expressions import evaluate
from tests.conftest import EXAMPLES, open_session

EXCEPTION_NAMES = re.compile(r"\b(?:%s)\b" % "|".join(
    n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)))
NAMES = {"x": torch.arange(24, dtype=torch.float32).reshape(3, 8), "v": torch.linspace(-1, 1, 4096),
         "b": torch.ones(3), "mask": torch.zeros(2**26, dtype=torch.bool)}


def refused(text: str, names: dict = NAMES, within_s: float = 2.0) -> str:
    """The message an expression is refused with; it must come at once and in the user's words."""
    started = time.monotonic()
    with pytest.raises(ExpressionError) as caught:
        evaluate(text, names)
    assert time.monotonic() - started < within_s, f"{text!r} took {time.monotonic() - started:.1f} s to refuse"
    message = str(caught.value)
    assert not EXCEPTION_NAMES.search(message) and "Traceback" not in message, message
    return message


def test_a_power_whose_result_would_be_huge_is_refused_by_its_digits():
    assert refused("9**9**9") == ("the result of 9**9**9 would have about 3.7e8 digits; "
                                  "expressions are limited to ~1200 digits")
    assert "2.0e6 digits" in refused("3**(2**22)")
    assert "1,505 digits" in refused("2**5000")
    assert evaluate("2**4000", {}) == 2**4000 and evaluate("(-1)**(10**18)", {}) == 1
    assert evaluate("2.0**0.5", {}) == pytest.approx(2**0.5) and evaluate("10**-400", {}) == 0.0


def test_shifts_and_products_of_big_integers_are_refused_by_their_bit_length():
    assert "digits" in refused("1 << 10**9")
    assert "digits" in refused("2**3000 * 2**3000")
    assert "digits" in refused("int('9' * 64 * 70)")
    assert evaluate("1 << 100", {}) == 2**100 and evaluate("5 >> 10**18", {}) == 0


def test_float_overflow_and_division_by_zero_are_messages_about_the_expression():
    assert refused("10.0**400") == "the result of 10.0**400 is too large for a number"
    assert refused("float(10**400)") == "the result of float(10**400) is too large for a number"
    assert refused("1/0") == "division by zero in 1/0"
    assert refused("x[0, 0] // 0 + 1 % 0") == "division by zero in 1 % 0"
    assert "infinity" in refused("int(inf)")


def test_strings_and_lists_are_refused_by_their_length_before_they_are_built():
    assert refused("'a' * 64 * 10**6") == ("'a' * 64 * 10**6 would make a string of 64,000,000+ characters; "
                                           "expressions are limited to 65,536")
    assert "list of" in refused("[0] * 10**12")
    assert "list of" in refused("[[0] * 65536] * 65536")
    assert "string of" in refused("'ab' * 30000 + 'cd' * 30000")
    assert len(evaluate("'ab' * 30000", {})) == 60000


def test_tensor_results_are_refused_by_their_size_before_they_are_allocated():
    message = refused("v[:, None, None] * v[None, :, None] * v[None, None, :]")
    assert "68,719,476,736 elements (shape [4096, 4096, 4096])" in message and "67,108,864" in message
    assert "elements" in refused("v[None, :].flatten()[[0] * 65536][:, None] * v")
    assert "elements" in refused("x.flatten()[[0] * 65536][:, None] > v")
    assert "elements" in refused("where(v[:, None, None] > 0, v[None, :, None], v[None, None, :])")
    assert "MiB" in refused("mask.double()")
    assert evaluate("(v[:, None] * v[None, :]).shape", NAMES) == torch.Size([4096, 4096])


def test_a_matmul_is_refused_by_its_result_and_its_multiply_adds():
    assert "elements" in refused("x.flatten()[[0] * 65536][:, None] @ x.flatten()[[0] * 65536][None, :]")
    names = {"w": torch.zeros(1, 1).expand(8192, 8192)}
    assert "multiply-adds" in refused("matmul(w, w) @ w", names)
    assert evaluate("(x @ x.T).shape", NAMES) == torch.Size([3, 3])


def test_a_list_made_of_a_tensor_is_refused_past_the_limit():
    assert "list of 69,632 numbers" in refused("v.reshape(1, -1)[[0] * 17].tolist()")
    assert len(evaluate("v.tolist()", NAMES)) == 4096


def test_torch_and_python_failures_become_messages_without_exception_names():
    assert refused("round(x)") == "round() of a tensor: use x.round()"
    assert "must match the size" in refused("x + b")
    assert "invalid for input of size 24" in refused("x.reshape(10**12)")
    assert "out of bounds" in refused("b[5]")
    assert refused("weights") == "name 'weights' is not defined at this tick"
    assert "function" in refused("sum") and "function" in refused("x.max")
    assert refused("1 in x") == "comparison 'in' is not allowed"
    assert refused("x is None") == "comparison 'is' is not allowed"
    assert "min() of a tensor" in refused("min(mask)")
    assert "digits" in refused("round(5, -10**9)")


def test_nesting_is_bounded_when_the_expression_is_compiled():
    assert refused("-" * 1500 + "1") == "the expression nests too deeply (more than 100 levels)"
    assert "nests too deeply" in refused("1" + " + 1" * 400)
    assert "nests too deeply" in refused("-(" * 150 + "1" + ")" * 150)
    assert "too many nested parentheses" in refused("(" * 300 + "1" + ")" * 300)
    assert evaluate("-(" * 40 + "1" + ")" * 40, {}) == 1


def test_an_error_quotes_at_most_200_characters_of_the_expression():
    assert len(refused("(" * 300 + "1" + ")" * 300)) < 300
    assert len(refused("x" * 1999)) < 200
    assert len(refused("x" * 1900 + ".shape + (")) < 300
    assert len(refused("max(" + ", ".join(["1"] * 600) + ") % 0")) < 200


def test_a_stop_flag_ends_evaluation_between_operations():
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 5

    with pytest.raises(ExpressionError, match=r"^evaluation stopped \(pause\)$"):
        evaluate("1 + 2 + 3 + 4 + 5 + 6 + 7", {}, stop=stop)
    assert evaluate("1 + 2", {}, stop=lambda: False) == 3


SLOW = " + ".join(["(x.flatten()[[0]*8192][:, None] * x.flatten()[[1]*8192]).sum()"] * 28)


def test_session_interrupt_stops_the_running_evaluation_and_leaves_motions_alone():
    session = open_session(EXAMPLES / "mlp.py")
    stopper = threading.Timer(0.5, session.interrupt)
    stopper.start()
    started = time.monotonic()
    with pytest.raises(ExpressionError, match=r"^evaluation stopped \(pause\)$"):
        session.evaluate(SLOW)
    assert time.monotonic() - started < 4.0
    assert float(session.evaluate("x.sum() * 0")) == 0.0  # the next evaluation runs
    session.interrupt()  # between evaluations: no effect on the next one, nor on a motion
    assert float(session.evaluate("x.sum() * 0")) == 0.0
    assert session.step(granularity="instruction").reason == "step" and session.position == 1


def test_added_functions_run_as_torch_spells_them():
    assert evaluate("nonzero(x > 21).tolist()", NAMES) == [[2, 6], [2, 7]]
    assert evaluate("x.nonzero().shape", NAMES) == torch.Size([23, 2])
    assert [t.tolist() for t in evaluate("where(x > 21)", NAMES)] == [[2, 2], [6, 7]]
    assert evaluate("x.where(x > 21, 0.0).sum()", NAMES) == 45
    assert evaluate("diagonal(x).tolist()", NAMES) == [0, 9, 18] == evaluate("x.diagonal().tolist()", NAMES)
    assert evaluate("pow(b, 2).sum()", NAMES) == 3 and evaluate("x.pow(2)[0, 3]", NAMES) == 9
    assert evaluate("histc(x, bins=3).tolist()", NAMES) == [8, 8, 8] == evaluate("x.histc(3).tolist()", NAMES)
    assert evaluate("quantile(v, 0.5)", NAMES) == pytest.approx(0.0, abs=1e-6)
    assert evaluate("topk(x, 2)[0][0].tolist()", NAMES) == [7, 6] == evaluate("x.topk(2)[0][0].tolist()", NAMES)
    assert evaluate("argmax(x)", NAMES) == 23 and evaluate("x.argmax()", NAMES) == 23
    assert bool(evaluate("isclose(x, x + 1e-9).all()", NAMES)) and bool(evaluate("x.isclose(x).all()", NAMES))


def test_added_functions_are_refused_past_their_limits_before_they_run():
    assert refused("nonzero(~mask)") == ("the result of nonzero(~mask) would take 512 MiB; expressions are limited "
                                         "to 256 MiB: slice the operands first")
    assert "would take" in refused("where(~mask)") and "would take" in refused("(~mask).nonzero()")
    assert refused("histc(x, bins=10**9)") == ("histc(x, bins=10**9) asks for 1,000,000,000 bins; a histogram in an "
                                               "expression has 1 to 65,536")
    assert "asks for 0 bins" in refused("x.histc(0)")
    big = {"big": torch.zeros(2**24 + 1)}
    assert refused("quantile(big, 0.5)", big) == ("quantile(big, 0.5) would sort 16,777,217 values; quantile() takes "
                                                  "at most 16,777,216: slice the tensor first")
    assert refused("topk(x, 9)") == "topk(x, 9) asks for the top 9; dimension -1 has 8 elements"
    assert "top -1" in refused("x.topk(-1)")
    assert refused("pow(2, 10**9)") == "pow(2, 10**9): pow() takes a tensor; for two numbers write a ** b"
    assert "elements" in refused("pow(v[:, None, None], v[None, :, None] + v[None, None, :])")
    assert "elements" in refused("isclose(v[:, None, None], v[None, :, None] + v[None, None, :])")


def test_an_unknown_function_or_method_is_refused_with_the_ones_allowed():
    message = refused("argwhere(x)")
    assert message.startswith("'argwhere' is not a function expressions allow (functions: abs, allclose, amax")
    functions = message.split("functions: ")[1].split(";")[0].split(", ")
    assert {"nonzero", "diagonal", "pow", "histc", "quantile", "where", "topk", "argmax", "isclose"} <= set(functions)
    assert "tensor methods: abs, all," in message
    assert refused("x.fill_(0)").startswith("attribute 'fill_' is not in the allowed set (tensor methods: abs, ")


def test_dollar_name_reads_the_program_value_even_where_a_function_or_a_variable_has_that_name():
    names = {"mean": torch.ones(2), "$mean": torch.full((2,), 7.0), "$rsqrt": torch.tensor([1.0, math.inf]),
             "scale": torch.zeros(1)}
    assert refused("mean", names) == "'mean' is a function: call it, as in sum(x); the program value named 'mean' is " \
                                     "$mean"
    assert evaluate("$mean.sum()", names) == 14 and evaluate("mean($mean)", names) == 7
    assert bool(evaluate("$rsqrt.isinf().any()", names)) and evaluate("'$rsqrt'", names) == "$rsqrt"
    assert evaluate("($rsqrt\n + 1)[0]", names) == 2
    assert refused("$nothing + 1", names) == ("no value named 'nothing' in the program ($name reads a node's output, "
                                              "an input or a parameter)")
    assert refused("$ mean", names) == "'$' goes right before a value's name, as in $div (got '$ mean')"
    assert refused("x.$max()", names) == "'$' goes right before a value's name, as in $div (got 'x.$max()')"
    assert refused("$mean(1)", names).startswith("'$mean' is not a function expressions allow (")
    assert refused("$_private", names) == "name '_private' is not allowed"
    assert "in $rsqrt.reshape(3)" in refused("$rsqrt.reshape(3)", names)
