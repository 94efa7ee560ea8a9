"""`--against OP`: a kernel launch's outputs against a torch op instead of its file's `reference()`.

OP names an op (`softmax`, `torch.softmax`, `F.layer_norm`), called with the tensors the kernel only reads in
parameter order, or calls one with the kernel's parameters and literal values (`torch.softmax(x_ptr, dim=-1)`,
`F.layer_norm(x_ptr, (n_cols,), w_ptr, eps=eps)`). It is read with `ast` and never evaluated: the op is found by
attribute lookup in torch, torch.nn.functional (F), torch.special or torch.linalg and must be one of torch's
tensor functions (those torch.overrides lists: torch.save or torch.manual_seed are not); every argument is a
parameter's name, a number, a string, True/False/None, or a tuple or list of them. The op runs on the launch's
tensors cast to float64.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hardware.errors import ExpressionError, echo
from hardware.expressions import clean_message  # someone else's message in one line, without Python's exception names

NAMESPACES = {"torch": torch, "torch.nn.functional": torch.nn.functional, "F": torch.nn.functional,
              "torch.special": torch.special, "torch.linalg": torch.linalg}
SEARCHED = ("torch", "torch.nn.functional", "torch.special", "torch.linalg")  # for a bare op name, in this order
LITERALS = (int, float, bool, str, type(None))
SHAPE = "--against takes an op (softmax, torch.softmax, F.layer_norm) or a call of one with the kernel's parameters"
_KINDS = {ast.Call: "a call", ast.Attribute: "an attribute", ast.Lambda: "a lambda", ast.Subscript: "an index",
          ast.BinOp: "arithmetic", ast.Compare: "a comparison", ast.BoolOp: "boolean logic",
          ast.Starred: "an unpacking", ast.Dict: "a dict", ast.Set: "a set", ast.JoinedStr: "an f-string",
          ast.NamedExpr: "an assignment", ast.IfExp: "a conditional", ast.ListComp: "a comprehension",
          ast.GeneratorExp: "a generator", ast.Constant: "a literal", ast.Name: "a name"}


class AgainstError(ExpressionError):
    """--against names no op Rewind may call, or its op fails on the launch: the user's input, a usage error."""


@dataclass(frozen=True)
class AgainstOp:
    text: str  # as the user wrote it
    name: str  # the op as found: torch.nn.functional.layer_norm
    op: Callable
    args: tuple[ast.expr, ...] | None  # None: a bare name, called with the tensors the kernel only reads
    keywords: tuple[tuple[str, ast.expr], ...]

    def call(self, inputs: list[str]) -> str:
        """The call the op is made with, in the kernel's parameter names (`inputs`: the tensors the kernel only
        reads): torch.softmax(x_ptr, dim=-1)."""
        if self.args is None:
            return f"{self.name}({', '.join(inputs)})"
        said = [ast.unparse(a) for a in self.args] + [f"{k}={ast.unparse(v)}" for k, v in self.keywords]
        return f"{self.name}({', '.join(said)})"

    def results(self, kernel: str, arguments: dict[str, Any], inputs: list[str], fits: Callable[[Any], Any]) -> Any:
        """The op on the launch's arguments (parameter -> value; floating tensors in float64). It runs first on
        shape-only (meta) tensors, and `fits` refuses a result of another count or shape than the kernel's outputs
        before the op computes anything (an op past its outputs' size costs nothing)."""
        def named(name: str) -> Any:
            if name not in arguments:
                raise AgainstError(f"'{echo(name)}' in --against is not a parameter of {kernel} (its parameters: "
                                   f"{', '.join(arguments)})")
            value = arguments[name]
            if not isinstance(value, (torch.Tensor, int, float)):
                raise AgainstError(f"'{name}' in --against is a {type(value).__name__} in this launch: --against "
                                   "passes the kernel's tensors and numbers")
            return value

        if self.args is None:
            args = [arguments[n] for n in inputs]
            kwargs = {}
        else:
            args = [_value(a, named) for a in self.args]
            kwargs = {k: _value(v, named) for k, v in self.keywords}
        try:
            with torch.no_grad():
                predicted = self.op(*_on_meta(args), **_on_meta(kwargs))
        except Exception:  # an op without a meta kernel, or one that fails: said when it runs
            predicted = None
        if predicted is not None:
            fits(predicted)
        try:
            with torch.no_grad():
                return self.op(*args, **kwargs)
        except Exception as exc:  # the op's own words on these inputs: a usage error, not a crash
            raise AgainstError(f"--against {self.call(inputs)} failed on the launch's tensors: "
                               f"{clean_message(exc) or 'an error without a message'}") from None


def parse_against(text: str) -> AgainstOp:
    """The op and arguments of `--against OP`, checked before the kernel runs (names are checked against the
    kernel's parameters when the op is called)."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise AgainstError(f"--against '{echo(text)}' cannot be read: {clean_message(exc.msg)}; {SHAPE}") from None
    except (ValueError, RecursionError, MemoryError):
        raise AgainstError(f"--against '{echo(text)}' cannot be read (it nests too deeply or holds characters "
                           f"Python does not accept); {SHAPE}") from None
    if not isinstance(tree, ast.Call):
        return AgainstOp(text, *_op(tree, text), None, ())
    for part in tree.args:
        _value(part, lambda name: None)
    for keyword in tree.keywords:
        if keyword.arg is None:
            raise AgainstError(f"--against '{echo(text)}' unpacks a dict (**): {SHAPE} and literal values")
        _value(keyword.value, lambda name: None)
    return AgainstOp(text, *_op(tree.func, text), tuple(tree.args), tuple((k.arg, k.value) for k in tree.keywords))


def _op(node: ast.expr, text: str) -> tuple[str, Callable]:
    """The op a dotted name is, found by attribute lookup in the namespaces (never by evaluating anything)."""
    parts = _dotted(node)
    if parts is None:
        while isinstance(node, ast.Attribute):  # what the dotted name hangs off: __import__('os') in ....system
            node = node.value
        raise AgainstError(f"--against '{echo(text)}': '{echo(ast.unparse(node))}' is {_kind(node)}, not an op's "
                           f"name; {SHAPE}")
    for part in parts:
        if part.startswith("_"):
            kind = "dunder" if part.startswith("__") and part.endswith("__") else "private"
            raise AgainstError(f"--against '{echo(text)}': '{echo(part)}' is a {kind} name; --against takes the "
                               "public ops of torch, torch.nn.functional (F), torch.special and torch.linalg")
    if len(parts) == 1:
        for space in SEARCHED:
            if _is_op(getattr(NAMESPACES[space], parts[0], None)):
                return f"{space}.{parts[0]}", getattr(NAMESPACES[space], parts[0])
        raise AgainstError(f"--against: there is no op '{echo(parts[0])}' in torch, torch.nn.functional, "
                           "torch.special or torch.linalg")
    space, name = ".".join(parts[:-1]), parts[-1]
    if space not in NAMESPACES:
        raise AgainstError(f"--against '{echo(text)}': '{echo(space)}' is not a namespace --against looks in "
                           "(torch, torch.nn.functional or F, torch.special, torch.linalg)")
    found = getattr(NAMESPACES[space], name, None)
    if found is None:
        raise AgainstError(f"--against: there is no op '{echo(name)}' in {NAMESPACES[space].__name__}")
    if not _is_op(found):
        raise AgainstError(f"--against: {space}.{name} is not an op on tensors (torch.overrides does not list it "
                           "among torch's tensor functions)")
    return f"{NAMESPACES[space].__name__}.{name}", found


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def _value(node: ast.expr, named: Callable[[str], Any]) -> Any:
    """An argument of the call: a parameter's value (`named`), a literal, or a tuple or list of them."""
    if isinstance(node, ast.Name):
        return named(node.id)
    if isinstance(node, ast.Constant) and isinstance(node.value, LITERALS):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and \
            isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_value(item, named) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    raise AgainstError(f"--against: the argument '{echo(ast.unparse(node))}' is {_kind(node)}; the arguments are "
                       "the kernel's parameters by name and literal values (numbers, strings, True, False, None, "
                       "tuples and lists of them)")


def _on_meta(value: Any) -> Any:
    """The arguments with each tensor a shape-only one (the op's result shape, computing nothing)."""
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, (tuple, list)):
        return type(value)(_on_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _on_meta(v) for k, v in value.items()}
    return value


def _kind(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and not isinstance(node.value, LITERALS):
        return "a literal of a kind --against does not take"
    return next((said for kind, said in _KINDS.items() if isinstance(node, kind)), "an expression")


def _is_op(found: Any) -> bool:
    try:
        return callable(found) and found in _tensor_functions()
    except TypeError:  # an unhashable callable is no torch function
        return False


@functools.cache
def _tensor_functions() -> frozenset:
    from torch.overrides import get_overridable_functions  # deferred: only --against asks
    return frozenset(f for found in get_overridable_functions().values() for f in found)
