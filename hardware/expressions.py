"""A safe expression language over live tensors (conditions, watches, hovers, the REPL).

Python syntax, checked node by node against a whitelist before anything runs: names of
live values, numbers, indexing and slicing, arithmetic, comparisons, boolean logic, and a
fixed set of numeric functions and tensor methods. No imports, no attribute beyond the
whitelist, no dunder access, no lambdas or comprehensions: nothing that reaches code.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable, Mapping

import torch

from hardware.errors import ExpressionError

_MAX_LENGTH = 2000

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": torch.abs, "exp": torch.exp, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "softmax": torch.softmax, "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite,
    "sum": torch.sum, "mean": torch.mean, "std": torch.std, "var": torch.var, "amax": torch.amax,
    "amin": torch.amin, "argmax": torch.argmax, "argmin": torch.argmin, "norm": torch.linalg.norm,
    "allclose": torch.allclose, "where": torch.where, "count_nonzero": torch.count_nonzero,
    "maximum": torch.maximum, "minimum": torch.minimum, "matmul": torch.matmul, "topk": torch.topk,
    "cosine": lambda a, b: torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0),
    "float": float, "int": int, "bool": bool, "len": len, "min": min, "max": max, "round": round,
}
CONSTANTS: dict[str, Any] = {"nan": math.nan, "inf": math.inf, "pi": math.pi, "e": math.e, "True": True,
                             "False": False, "None": None}
METHODS = {
    "abs", "max", "min", "sum", "mean", "std", "var", "norm", "amax", "amin", "argmax", "argmin", "any",
    "all", "item", "float", "double", "half", "bfloat16", "int", "long", "bool", "isnan", "isinf",
    "isfinite", "flatten", "reshape", "view", "transpose", "permute", "t", "exp", "log", "sqrt", "tolist",
    "numel", "dim", "size", "count_nonzero", "clamp", "round", "sign", "square", "softmax", "topk", "sort",
    "squeeze", "unsqueeze", "contiguous", "diff", "cumsum", "prod", "allclose", "eq", "ne", "lt", "le",
    "gt", "ge", "nan_to_num", "nansum", "nanmean", "median",
}
ATTRIBUTES = {"shape", "dtype", "T", "ndim", "real", "imag", "mT"}
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.MatMult: operator.matmul, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
           ast.BitXor: operator.xor}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}


def compile_expression(text: str) -> ast.Expression:
    """Parse and check an expression; raises ExpressionError naming what is refused."""
    if len(text) > _MAX_LENGTH:
        raise ExpressionError(f"expression longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"syntax error in '{text}': {exc.msg}") from None
    for node in ast.walk(tree):
        _check(node)
    return tree


def _check(node: ast.AST) -> None:
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Subscript, ast.Slice,
               ast.Name, ast.Constant, ast.Call, ast.Attribute, ast.Tuple, ast.List, ast.Load, ast.keyword,
               ast.IfExp, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.Starred)
    if not isinstance(node, allowed):
        raise ExpressionError(f"'{type(node).__name__}' is not allowed in expressions")
    if isinstance(node, ast.Name) and node.id.startswith("_"):
        raise ExpressionError(f"name '{node.id}' is not allowed")
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            raise ExpressionError(f"attribute '{node.attr}' is not allowed")
        if node.attr not in ATTRIBUTES and node.attr not in METHODS:
            raise ExpressionError(f"attribute '{node.attr}' is not in the allowed set")
    if isinstance(node, ast.Constant) and isinstance(node.value, (bytes, str)) and len(node.value) > 64:
        raise ExpressionError("string constants are limited to 64 characters")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        right = node.right
        if isinstance(right, ast.Constant) and isinstance(right.value, (int, float)) and abs(right.value) > 64:
            raise ExpressionError("exponents are limited to 64")


def evaluate(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate a checked expression; `names` maps value names to tensors (looked up lazily)."""
    tree = compile_expression(text)
    try:
        return _Evaluator(names).visit(tree.body)
    except ExpressionError:
        raise
    except KeyError as exc:
        raise ExpressionError(f"name {exc} is not defined at this tick") from None
    except Exception as exc:
        raise ExpressionError(f"{type(exc).__name__}: {exc}") from None


class _Evaluator:
    def __init__(self, names: Mapping[str, Any]):
        self.names = names

    def visit(self, node: ast.AST) -> Any:
        return getattr(self, "visit_" + type(node).__name__)(node)

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            return FUNCTIONS[node.id]
        return self.names[node.id]

    def visit_Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.visit(e) for e in node.elts)

    def visit_List(self, node: ast.List) -> Any:
        return [self.visit(e) for e in node.elts]

    def visit_Slice(self, node: ast.Slice) -> slice:
        part = lambda n: None if n is None else self.visit(n)  # noqa: E731
        return slice(part(node.lower), part(node.upper), part(node.step))

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        return self.visit(node.value)[self.visit(node.slice)]

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        return _BINOPS[type(node.op)](self.visit(node.left), self.visit(node.right))

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.Not) and isinstance(value, torch.Tensor):
            return ~value.bool()
        return _UNARY[type(node.op)](value)

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        result = None
        for v in node.values:
            result = self.visit(v)
            if isinstance(node.op, ast.And) and not _truth(result):
                return result
            if isinstance(node.op, ast.Or) and _truth(result):
                return result
        return result

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        result: Any = True
        for op, comp in zip(node.ops, node.comparators):
            right = self.visit(comp)
            if type(op) not in _COMPARE:
                raise ExpressionError(f"comparison '{type(op).__name__}' is not allowed")
            r = _COMPARE[type(op)](left, right)
            result = r if result is True else result & r
            left = right
        return result

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if _truth(self.visit(node.test)) else self.visit(node.orelse)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        obj = self.visit(node.value)
        if not isinstance(obj, torch.Tensor) and not (node.attr in ("real", "imag") and isinstance(obj, complex)):
            raise ExpressionError(f"'.{node.attr}' applies to tensors, not {type(obj).__name__}")
        return getattr(obj, node.attr)

    def visit_Starred(self, node: ast.Starred) -> Any:
        raise ExpressionError("starred arguments are not allowed")

    def visit_Call(self, node: ast.Call) -> Any:
        func = self.visit(node.func)
        if isinstance(node.func, ast.Name):
            if node.func.id not in FUNCTIONS:
                raise ExpressionError(f"'{node.func.id}' is not a callable function")
        elif not isinstance(node.func, ast.Attribute) or node.func.attr not in METHODS:
            raise ExpressionError("only whitelisted functions and tensor methods can be called")
        args = [self.visit(a) for a in node.args]
        kwargs = {k.arg: self.visit(k.value) for k in node.keywords if k.arg}
        if len(kwargs) != len(node.keywords):
            raise ExpressionError("'**' arguments are not allowed")
        return func(*args, **kwargs)


def _truth(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return bool(value.all())
        return bool(value.item())
    return bool(value)


def truth(value: Any) -> bool:
    """A condition's result as a bool: a tensor is true when all its elements are."""
    return _truth(value)
