"""A safe expression language over live tensors (conditions, watches, hovers, the REPL).

Python syntax, checked node by node against a whitelist before anything runs: names of
live values, numbers, indexing and slicing, arithmetic, comparisons, boolean logic, and a
fixed set of numeric functions and tensor methods. `$name` is always the Program value `name`,
whatever function or variable shares its name. No imports, no attribute beyond the whitelist, no
dunder access, no lambdas or comprehensions: nothing that reaches code.

Nothing an expression computes may cost more than a debugger's glance: before each operation
runs, the size of its result is predicted and refused past a limit (an integer's digits, a
string's or a list's length, a tensor's elements and bytes, a matmul's multiply-adds; a tensor
op's result shape comes from running it on shape-only "meta" tensors first). Nesting depth is
bounded when the expression is compiled, and evaluation checks a stop flag between operations.
Every error names the part of the expression it is about, in the user's terms.
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import math
import operator
import re
import tokenize
from typing import Any, Callable, Mapping

import torch

from hardware.errors import ExpressionError, RewindError, echo

MAX_LENGTH = 2000  # characters of an expression
MAX_DEPTH = 100  # nesting levels of its syntax tree
MAX_INT_BITS = 4096  # an integer result (about 1233 decimal digits)
MAX_SEQUENCE = 65536  # characters of a string, items of a list or tuple (nested lists counted whole)
MAX_ELEMENTS = 2**26  # elements of a tensor result
MAX_BYTES = 256 * 2**20  # bytes of a tensor result
MAX_MULTIPLY_ADDS = 2**36  # of one matmul
MAX_ROUND_DIGITS = 1300
MAX_BINS = 65536  # of a histc()
MAX_QUANTILE_VALUES = 2**24  # values quantile() sorts (torch's own limit)
ECHO = 80  # characters of the user's text quoted in an error about part of it
ECHO_WHOLE = 200  # ... about all of it
_MAX_DIGITS = int(MAX_INT_BITS * math.log10(2))
_MAX_DIGITS_TEXT = f"~{_MAX_DIGITS // 100 * 100}"

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": torch.abs, "exp": torch.exp, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "softmax": torch.softmax, "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite,
    "sum": torch.sum, "mean": torch.mean, "std": torch.std, "var": torch.var, "amax": torch.amax,
    "amin": torch.amin, "argmax": torch.argmax, "argmin": torch.argmin, "norm": torch.linalg.norm,
    "allclose": torch.allclose, "where": torch.where, "count_nonzero": torch.count_nonzero,
    "maximum": torch.maximum, "minimum": torch.minimum, "matmul": torch.matmul, "topk": torch.topk,
    "nonzero": torch.nonzero, "diagonal": torch.diagonal, "pow": torch.pow, "histc": torch.histc,
    "quantile": torch.quantile, "isclose": torch.isclose,
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
    "gt", "ge", "nan_to_num", "nansum", "nanmean", "median", "nonzero", "diagonal", "pow", "histc", "quantile",
    "where", "isclose",
}
ATTRIBUTES = {"shape", "dtype", "T", "ndim", "real", "imag", "mT"}
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.MatMult: operator.matmul, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
           ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
            ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
            ast.LShift: "<<", ast.RShift: ">>", ast.In: "in", ast.NotIn: "not in", ast.Is: "is",
            ast.IsNot: "is not"}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Subscript, ast.Slice,
            ast.Name, ast.Constant, ast.Call, ast.Attribute, ast.Tuple, ast.List, ast.Load, ast.keyword,
            ast.IfExp, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.Starred)
_REFUSED_NAMES = {"Lambda": "lambdas", "ListComp": "comprehensions", "SetComp": "comprehensions",
                  "DictComp": "comprehensions", "GeneratorExp": "generator expressions",
                  "NamedExpr": "':=' assignments", "JoinedStr": "f-strings", "FormattedValue": "f-strings",
                  "Dict": "dict literals", "Set": "set literals", "Await": "await", "Yield": "yield",
                  "YieldFrom": "yield"}
# Python's own exception names never reach the user (a message from torch may quote one).
_EXCEPTION_NAMES = re.compile(r"\b(?:%s)\b:?\s*" % "|".join(sorted(
    (n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)),
    key=len, reverse=True)))



class UndefinedNameError(ExpressionError):
    """A name of the expression is not defined at this tick (a variable not assigned yet, a value not written yet)."""


PROGRAM_VALUE = "$"  # `$div`: the Program value `div`, even where a function, a constant or a variable has its name
_DOLLAR = "'$' goes right before a value's name, as in $div"
GRADIENT = "grad"  # grad(l1.weight): a training step's gradient of a parameter, read as the name `grad(l1.weight)`


def gradient_path(name: str) -> str | None:
    """The parameter a name `grad(PATH)` is the gradient of (None for any other name)."""
    return name[len(GRADIENT) + 1:-1] if name.startswith(GRADIENT + "(") and name.endswith(")") else None


def compile_expression(text: str) -> ast.Expression:
    """Parse and check an expression; raises ExpressionError naming what is refused.

    Each name written `$name` is a Name node marked `program_value`; the tree's `program_values` holds their
    (line, column) so messages can quote them as written."""
    if not isinstance(text, str):
        raise ExpressionError("an expression must be text")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"the expression has {len(text)} characters; expressions are limited to {MAX_LENGTH}")
    return _compiled(text.strip())


@functools.lru_cache(maxsize=256)
def _compiled(text: str) -> ast.Expression:
    """compile_expression's work, once per text: a scan (`find`) evaluates one expression at many ticks."""
    source, marked = _program_values(text)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"syntax error in '{echo(text, ECHO_WHOLE)}': {clean_message(exc.msg)}") from None
    except (ValueError, RecursionError, MemoryError):
        raise ExpressionError(f"'{echo(text, ECHO_WHOLE)}' is not an expression Rewind can read "
                              "(it nests too deeply or holds characters Python does not accept)") from None
    gradients = _Gradients(marked)
    found = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:  # iterative: the tree may be deeper than the evaluator may recurse
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExpressionError(f"the expression nests too deeply (more than {MAX_DEPTH} levels)")
        gradients.replace_in(node)
        _check(node)
        if isinstance(node, ast.Name) and (node.lineno, node.col_offset) in marked:
            node.program_value = True
            found += 1
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    if found + gradients.consumed != len(marked):  # a `$` before an attribute (x.$y): not a value's name
        raise ExpressionError(f"{_DOLLAR} (got '{echo(text, ECHO_WHOLE)}')")
    tree.program_values = marked
    return tree


class _Gradients:
    """`grad(PATH)`, PATH a parameter's module path (`layers[1].attn.q.weight`) or a name, becomes one name,
    `grad(PATH)`, that the values an expression reads resolve: the gradient is a value of its own, not a function
    of the parameter's tensor."""

    def __init__(self, marked: frozenset[tuple[int, int]]):
        self.marked = marked
        self.consumed = 0  # `$name`s taken as a parameter: grad($p_l1_weight)

    def replace_in(self, parent: ast.AST) -> None:
        """Replace each grad(PATH) among `parent`'s children by its name."""
        for field, value in ast.iter_fields(parent):
            if isinstance(value, list):
                value[:] = [self._named(v) for v in value]
            elif isinstance(value, ast.AST):
                setattr(parent, field, self._named(value))

    def _named(self, node: Any) -> Any:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == GRADIENT
                and (node.func.lineno, node.func.col_offset) not in self.marked):
            return node
        path = self._path(node.args[0]) if len(node.args) == 1 and not node.keywords else None
        if path is None:
            raise ExpressionError("grad() takes one parameter, by its module path or name, as in grad(l1.weight)")
        return ast.copy_location(ast.Name(id=f"{GRADIENT}({path})", ctx=ast.Load()), node)

    def _path(self, node: ast.AST) -> str | None:
        """`layers[1].q.weight` as written (a name, attributes, integer indices); None for anything else."""
        parts: list[str] = []
        while not isinstance(node, ast.Name):
            if isinstance(node, ast.Attribute) and not node.attr.startswith("_"):
                parts.append(f".{node.attr}")
            elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                  and type(node.slice.value) is int):
                parts.append(f"[{node.slice.value}]")
            else:
                return None
            node = node.value
        if node.id.startswith("_"):
            return None
        dollar = (node.lineno, node.col_offset) in self.marked
        self.consumed += dollar
        return PROGRAM_VALUE * dollar + node.id + "".join(reversed(parts))


def _program_values(text: str) -> tuple[str, frozenset[tuple[int, int]]]:
    """`text` with each `$` outside string constants made a space (so every byte keeps its column; one that opens
    the text, a parenthesis closed at the end, since an expression may not start with a space), and the
    (line, byte column) of the name each one marks."""
    if PROGRAM_VALUE not in text:
        return text, frozenset()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text, frozenset()  # the parser says what is wrong with it
    lines = io.StringIO(text).readlines()
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    chars, marked = list(text), set()
    for token, following in zip(tokens, tokens[1:]):
        if token.type == tokenize.ERRORTOKEN and token.string == PROGRAM_VALUE:
            row, col = token.start
            if following.type != tokenize.NAME or following.start != (row, col + 1):
                raise ExpressionError(f"{_DOLLAR} (got '{echo(text, ECHO_WHOLE)}')")
            chars[starts[row - 1] + col] = " "
            marked.add((row, len(lines[row - 1][:col + 1].encode())))
    if chars[0] == " ":
        chars[0], chars[-1] = "(", chars[-1] + "\n)"  # on a line of its own: the text may end in a comment
    return "".join(chars), frozenset(marked)


def _check(node: ast.AST) -> None:
    if not isinstance(node, _ALLOWED):
        kind = type(node).__name__
        raise ExpressionError(f"{_REFUSED_NAMES.get(kind, kind)} not allowed in expressions")
    if isinstance(node, ast.Name) and node.id.startswith("_"):
        raise ExpressionError(f"name '{echo(node.id)}' is not allowed")
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            raise ExpressionError(f"attribute '{echo(node.attr)}' is not allowed")
        if node.attr not in ATTRIBUTES and node.attr not in METHODS:
            raise ExpressionError(f"attribute '{echo(node.attr)}' is not in the allowed set ({allowed_methods()})")
    if isinstance(node, ast.Constant) and isinstance(node.value, (bytes, str)) and len(node.value) > 64:
        raise ExpressionError("string constants are limited to 64 characters")
    if isinstance(node, ast.BinOp) and type(node.op) not in _BINOPS:
        raise ExpressionError(f"operator '{_SYMBOLS.get(type(node.op), '?')}' is not allowed in expressions")
    if isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise ExpressionError(f"comparison '{_SYMBOLS.get(type(op), '?')}' is not allowed")


def evaluate(text: str, names: Mapping[str, Any], stop: Callable[[], bool] | None = None) -> Any:
    """Evaluate a checked expression; `names` maps value names to tensors (looked up lazily), and `$name` keys
    to the Program value `name` (what `$name` in the expression reads).

    `stop` is asked between operations; when it answers true, evaluation ends with an ExpressionError."""
    tree = compile_expression(text)
    evaluator = _Evaluator(names, text.strip(), stop, tree.program_values)
    result = evaluator.visit(tree.body)
    if callable(result):
        raise ExpressionError(f"'{echo(text.strip())}' is a function: call it, as in sum(x){_value_hint(tree, names)}")
    return result


def _value_hint(tree: ast.Expression, names: Mapping[str, Any]) -> str:
    """For a bare function name that is also a Program value's: how to read the value."""
    name = tree.body.id if isinstance(tree.body, ast.Name) else None
    if name is None or PROGRAM_VALUE + name not in names:
        return ""
    return f"; the program value named '{name}' is ${name}"


def expression_names(text: str) -> list[tuple[str, bool]]:
    """The names an expression reads, each with whether it is written `$name` (functions and constants left out)."""
    tree = compile_expression(text)
    return [(n.id, getattr(n, "program_value", False)) for n in ast.walk(tree)
            if isinstance(n, ast.Name) and (getattr(n, "program_value", False)
                                            or (n.id not in FUNCTIONS and n.id not in CONSTANTS))]


def allowed_functions() -> str:
    """What an expression may call, as an error lists it."""
    return f"functions: {', '.join(sorted(FUNCTIONS))}; {allowed_methods()}"


def allowed_methods() -> str:
    return f"tensor methods: {', '.join(sorted(METHODS))}; attributes: {', '.join(sorted(ATTRIBUTES))}"


class _Evaluator:
    def __init__(self, names: Mapping[str, Any], source: str, stop: Callable[[], bool] | None,
                 marked: frozenset[tuple[int, int]] = frozenset()):
        self.names, self.source, self.stop, self.marked = names, source, stop, marked

    def visit(self, node: ast.AST) -> Any:
        if self.stop is not None and self.stop():
            raise ExpressionError("evaluation stopped (pause)")
        try:
            return getattr(self, "visit_" + type(node).__name__)(node)
        except RewindError:
            raise
        except Exception as exc:  # noqa: BLE001 -- every failure becomes a message about this part of the text
            raise ExpressionError(_translate(exc, self.text(node))) from None

    def text(self, node: ast.AST) -> str:
        """The part of the expression `node` was parsed from, as quoted in a message."""
        try:
            segment = ast.get_source_segment(self.source, node)  # `$` became a space: the columns are the same
        except Exception:  # noqa: BLE001 -- positions are a nicety
            segment = None
        if segment and (getattr(node, "lineno", 0), getattr(node, "col_offset", -1)) in self.marked:
            segment = PROGRAM_VALUE + segment  # it starts at a `$name`
        return echo(segment or self.source)

    # -- leaves --------------------------------------------------------------------------------------
    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        if getattr(node, "program_value", False):
            try:
                return self.names[PROGRAM_VALUE + node.id]
            except KeyError:
                raise ExpressionError(f"no value named '{echo(node.id)}' in the program ($name reads a node's "
                                      "output, an input or a parameter)") from None
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            return FUNCTIONS[node.id]
        try:
            return self.names[node.id]
        except KeyError:
            raise UndefinedNameError(f"name '{echo(node.id)}' is not defined at this tick") from None

    def visit_Tuple(self, node: ast.Tuple) -> Any:
        return self.admit(tuple(self.visit(e) for e in node.elts), node)

    def visit_List(self, node: ast.List) -> Any:
        return self.admit([self.visit(e) for e in node.elts], node)

    def visit_Slice(self, node: ast.Slice) -> slice:
        part = lambda n: None if n is None else self.visit(n)  # noqa: E731
        return slice(part(node.lower), part(node.upper), part(node.step))

    def visit_Starred(self, node: ast.Starred) -> Any:
        raise ExpressionError("starred arguments are not allowed")

    # -- operations: each result's size is predicted before it is computed -------------------------------
    def visit_Subscript(self, node: ast.Subscript) -> Any:
        obj, index = self.visit(node.value), self.visit(node.slice)
        if isinstance(obj, torch.Tensor) and _advanced(index):  # a list or tensor index can make it bigger
            try:
                predicted = _meta(obj)[_meta(index)]
            except Exception:  # noqa: BLE001 -- a mask (data-dependent: no bigger) or a bad index (torch says)
                predicted = None
            if predicted is not None:
                _admit_shape(predicted.shape, predicted.dtype, [obj], self.text(node))
        return self.apply(operator.getitem, (obj, index), node)

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        op = type(node.op)
        what = self.text(node)
        _check_numbers(op, left, right, what)
        if op is ast.MatMult and isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor):
            _check_matmul(left, right, what)
        elif isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
            _check_broadcast([left, right], what, divides=op is ast.Div)
        return self.apply(_BINOPS[op], (left, right), node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.Not) and isinstance(value, torch.Tensor):
            return ~value.bool()
        return self.apply(_UNARY[type(node.op)], (value,), node)

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
            if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
                _check_broadcast([left, right, result], self.text(node))
            r = self.apply(_COMPARE[type(op)], (left, right), node)
            result = r if result is True else self.apply(operator.and_, (result, r), node)
            left = right
        return result

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if _truth(self.visit(node.test)) else self.visit(node.orelse)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        obj = self.visit(node.value)
        if not isinstance(obj, torch.Tensor) and not (node.attr in ("real", "imag") and isinstance(obj, complex)):
            raise ExpressionError(f"'.{node.attr}' applies to tensors, not {_kind(obj)}")
        return getattr(obj, node.attr)

    def visit_Call(self, node: ast.Call) -> Any:
        if isinstance(node.func, ast.Name) and (node.func.id not in FUNCTIONS
                                                or getattr(node.func, "program_value", False)):
            raise ExpressionError(f"'{self.text(node.func)}' is not a function expressions allow "
                                  f"({allowed_functions()})")
        func = self.visit(node.func)
        if isinstance(node.func, ast.Name):
            name = node.func.id
        elif isinstance(node.func, ast.Attribute) and node.func.attr in METHODS:
            name = "." + node.func.attr
        else:
            raise ExpressionError("only whitelisted functions and tensor methods can be called")
        args = [self.visit(a) for a in node.args]
        kwargs = {k.arg: self.visit(k.value) for k in node.keywords if k.arg}
        if len(kwargs) != len(node.keywords):
            raise ExpressionError("'**' arguments are not allowed")
        owner = getattr(func, "__self__", None) if name.startswith(".") else None
        _check_call(name, owner if isinstance(owner, torch.Tensor) else None, args, kwargs, self.text(node))
        return self.apply(func, args, node, kwargs)

    def apply(self, fn: Callable[..., Any], args: Any, node: ast.AST, kwargs: dict | None = None) -> Any:
        """fn(*args, **kwargs), then the cheap check of what it made."""
        kwargs = kwargs or {}
        return self.admit(fn(*args, **kwargs), node, _tensors(args, kwargs, getattr(fn, "__self__", None)))

    def admit(self, value: Any, node: ast.AST, inputs: list[torch.Tensor] = ()) -> Any:
        """A computed value, refused when it is over a limit (the cheap check after the fact)."""
        what = self.text(node)
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
            raise ExpressionError(_digits_refusal(what, value.bit_length()))
        if isinstance(value, (str, bytes, list, tuple)) and not isinstance(value, torch.Size):
            size = _weight(value)
            if size > MAX_SEQUENCE:
                raise ExpressionError(_sequence_refusal(what, value, size))
        if isinstance(value, torch.Tensor):
            _admit_shape(value.shape, value.dtype, list(inputs), what)
        return value


# -- the limits ---------------------------------------------------------------------------------------
def _check_numbers(op: type, left: Any, right: Any, what: str) -> None:
    """Python ints and sequences: refuse before computing a result over its limit."""
    ints = all(isinstance(v, int) for v in (left, right))
    if ints and op is ast.Pow and right > 0 and abs(left) > 1:
        bits = math.log2(abs(left)) * right
        if bits > MAX_INT_BITS:
            raise ExpressionError(_digits_refusal(what, bits))
    elif ints and op is ast.LShift and right > 0 and left:
        if left.bit_length() + right > MAX_INT_BITS:
            raise ExpressionError(_digits_refusal(what, left.bit_length() + right))
    elif ints and op is ast.Mult and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
        raise ExpressionError(_digits_refusal(what, left.bit_length() + right.bit_length()))
    elif op is ast.Mult and (_is_sequence(left) and isinstance(right, int)
                             or _is_sequence(right) and isinstance(left, int)):
        seq, times = (left, right) if _is_sequence(left) else (right, left)
        size = _weight(seq) * max(times, 0)
        if size > MAX_SEQUENCE:
            raise ExpressionError(_sequence_refusal(what, seq, size))
    elif op is ast.Add and _is_sequence(left) and _is_sequence(right):
        size = _weight(left) + _weight(right)
        if size > MAX_SEQUENCE:
            raise ExpressionError(_sequence_refusal(what, left, size))


def _check_matmul(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """a @ b: its result's shape and its multiply-adds, from the operands' shapes (as torch.matmul reads them)."""
    if a.dim() == 0 or b.dim() == 0:
        return  # torch refuses it, in its own words
    left = (1, *a.shape) if a.dim() == 1 else tuple(a.shape)
    right = (*b.shape, 1) if b.dim() == 1 else tuple(b.shape)
    if left[-1] != right[-2]:
        return  # torch says which sizes differ
    try:
        batch = tuple(torch.broadcast_shapes(left[:-2], right[:-2]))
    except Exception:  # noqa: BLE001 -- batch shapes that do not broadcast: torch says so
        return
    shape = batch + ((left[-2],) if a.dim() > 1 else ()) + ((right[-1],) if b.dim() > 1 else ())
    work = math.prod(batch) * left[-2] * right[-1] * left[-1]
    if work > MAX_MULTIPLY_ADDS:
        raise ExpressionError(f"{what} would take about {work:.1e} multiply-adds; expressions are limited to "
                              f"{MAX_MULTIPLY_ADDS:.1e}: slice the operands first")
    _admit_shape(shape, torch.promote_types(a.dtype, b.dtype), [a, b], what)


_BROADCASTING = {"maximum", "minimum", "allclose", ".allclose", ".clamp", ".eq", ".ne", ".lt", ".le", ".gt", ".ge",
                 "pow", ".pow", "isclose", ".isclose"}  # results (or intermediates) broadcast from all their tensor arguments
_CONVERSIONS = {".float": torch.float32, ".double": torch.float64, ".half": torch.float16,
                ".bfloat16": torch.bfloat16, ".int": torch.int32, ".long": torch.int64, ".bool": torch.bool}


def _check_call(name: str, owner: torch.Tensor | None, args: list, kwargs: dict, what: str) -> None:
    """Refuse a call whose result would be over a limit, before it runs."""
    if name == "round":
        if args and isinstance(args[0], torch.Tensor):
            raise ExpressionError("round() of a tensor: use x.round()")
        digits = args[1] if len(args) > 1 else kwargs.get("ndigits")
        if isinstance(digits, int) and abs(digits) > MAX_ROUND_DIGITS:
            raise ExpressionError(f"round() to {digits} digits: expressions round to at most {MAX_ROUND_DIGITS}")
    elif name in ("min", "max") and len(args) == 1 and isinstance(args[0], torch.Tensor):
        if args[0].dim() == 0 or args[0].numel() > MAX_SEQUENCE:
            raise ExpressionError(f"{name}() of a tensor: use x.{name}() (or amax/amin)")
    elif name == ".tolist" and owner is not None and owner.numel() > MAX_SEQUENCE:
        raise ExpressionError(f"{what} would make a list of {owner.numel():,} numbers; expressions are limited "
                              f"to {MAX_SEQUENCE:,}: slice the tensor first")
    elif name == "matmul" and len(args) == 2 and all(isinstance(a, torch.Tensor) for a in args):
        _check_matmul(args[0], args[1], what)
    elif name.lstrip(".") in _SIZED:
        operands = [owner, *args] if owner is not None else list(args)
        if operands and isinstance(operands[0], torch.Tensor):
            _SIZED[name.lstrip(".")](operands, kwargs, what)
    elif name == "pow" and not any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
        raise ExpressionError(f"{what}: pow() takes a tensor; for two numbers write a ** b")
    elif name in _BROADCASTING:
        operands = [owner, *args, *kwargs.values()] if owner is not None else [*args, *kwargs.values()]
        _check_broadcast([a for a in operands if isinstance(a, (torch.Tensor, int, float, bool))], what)
    elif name in _CONVERSIONS and owner is not None:
        _admit_shape(owner.shape, _CONVERSIONS[name], [owner], what)


def _check_nonzero(operands: list, kwargs: dict, what: str) -> None:
    """nonzero(x) (and where(x)): one index per dimension for each nonzero element, counted before it runs."""
    x = operands[0]
    _admit_shape((int(torch.count_nonzero(x)), x.dim()), torch.int64, [], what)


def _check_where(operands: list, kwargs: dict, what: str) -> None:
    if len(operands) == 1 and not kwargs:
        _check_nonzero(operands, kwargs, what)  # where(condition): the indices where it holds
    else:
        _check_broadcast([a for a in (*operands, *kwargs.values()) if isinstance(a, (torch.Tensor, int, float,
                                                                                     bool))], what)


def _check_histc(operands: list, kwargs: dict, what: str) -> None:
    bins = kwargs.get("bins", operands[1] if len(operands) > 1 else 100)
    if isinstance(bins, int) and not 1 <= bins <= MAX_BINS:
        raise ExpressionError(f"{what} asks for {bins:,} bins; a histogram in an expression has 1 to {MAX_BINS:,}")


def _check_quantile(operands: list, kwargs: dict, what: str) -> None:
    n = operands[0].numel()
    if n > MAX_QUANTILE_VALUES:
        raise ExpressionError(f"{what} would sort {n:,} values; quantile() takes at most {MAX_QUANTILE_VALUES:,}: "
                              "slice the tensor first")


def _check_topk(operands: list, kwargs: dict, what: str) -> None:
    x = operands[0]
    k = kwargs.get("k", operands[1] if len(operands) > 1 else None)
    dim = kwargs.get("dim", operands[2] if len(operands) > 2 else -1)
    if not (isinstance(k, int) and isinstance(dim, int)) or x.dim() == 0 or not -x.dim() <= dim < x.dim():
        return  # torch says what is wrong with them
    size = x.shape[dim]
    if not 0 <= k <= size:
        raise ExpressionError(f"{what} asks for the top {k:,}; dimension {dim} has {size:,} elements")


_SIZED: dict[str, Callable[[list, dict, str], None]] = {  # a result whose size its arguments decide
    "nonzero": _check_nonzero, "where": _check_where, "histc": _check_histc, "quantile": _check_quantile,
    "topk": _check_topk}


def _check_broadcast(operands: list, what: str, divides: bool = False) -> None:
    """An elementwise op of tensors (and numbers): its result has the broadcast shape of its operands."""
    tensors = [t for t in operands if isinstance(t, torch.Tensor)]
    if not all(isinstance(t, (torch.Tensor, int, float, bool, complex)) for t in operands):
        return  # not elementwise over tensors: torch refuses it in its own words
    try:
        shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        itemsize = max(t.element_size() for t in tensors)
    except Exception:  # noqa: BLE001 -- shapes that do not broadcast: the op itself says so
        return
    dtype = {8: torch.float64, 4: torch.float32, 2: torch.float16, 1: torch.bool}.get(itemsize, torch.complex128)
    _admit_shape(shape, torch.float32 if divides and itemsize < 4 else dtype, tensors, what)


def _admit_shape(shape: Any, dtype: torch.dtype, inputs: list[torch.Tensor], what: str) -> None:
    """A tensor result may be as big as the limits, or as big as a tensor it was computed from."""
    n = math.prod(shape)
    nbytes = n * _itemsize(dtype)
    biggest = max((t.numel() for t in inputs), default=0)
    biggest_bytes = max((t.numel() * t.element_size() for t in inputs), default=0)
    if n > max(MAX_ELEMENTS, biggest):
        raise ExpressionError(f"the result of {what} would have {n:,} elements (shape {list(shape)}); "
                              f"expressions are limited to {MAX_ELEMENTS:,}: slice the operands first")
    if nbytes > max(MAX_BYTES, 2 * biggest_bytes):
        raise ExpressionError(f"the result of {what} would take {_size(nbytes)}; expressions are limited to "
                              f"{_size(MAX_BYTES)}: slice the operands first")


def _itemsize(dtype: Any) -> int:
    try:
        return torch.empty((), dtype=dtype, device="meta").element_size()
    except Exception:  # noqa: BLE001
        return 8


def _meta(value: Any) -> Any:
    """Shape-only copies of the tensors in an index."""
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, tuple):
        return tuple(_meta(v) for v in value)
    return value


def _advanced(index: Any) -> bool:
    """Is it an index that gathers (a list or tensor in it), whose result can be bigger than the tensor?"""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, (list, torch.Tensor)) for p in parts)


def _tensors(args: Any, kwargs: dict, owner: Any = None) -> list[torch.Tensor]:
    found = [owner] if isinstance(owner, torch.Tensor) else []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, tuple):
            found.extend(v for v in value[:64] if isinstance(v, torch.Tensor))
    return found


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (str, bytes, list, tuple))


def _weight(value: Any, budget: int = MAX_SEQUENCE + 1) -> int:
    """Characters of a string, items of a list counting nested lists and strings whole (stops past `budget`)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if not isinstance(value, (list, tuple)):
        return 1
    total = len(value)
    stack = [value]
    while stack and total < budget:
        for item in stack.pop():
            if isinstance(item, (str, bytes)):
                total += len(item)
            elif isinstance(item, (list, tuple)) and item:
                total += len(item)
                stack.append(item)
            if total >= budget:
                break
    return total


def _digits_refusal(what: str, bits: float) -> str:
    digits = bits * math.log10(2)
    about = f"{digits:.1e}".replace("e+0", "e").replace("e+", "e") if digits >= 1e5 else f"{int(digits):,}"
    return (f"the result of {what} would have about {about} digits; "
            f"expressions are limited to {_MAX_DIGITS_TEXT} digits")


def _sequence_refusal(what: str, like: Any, size: int) -> str:
    kind = "string of" if isinstance(like, (str, bytes)) else "list of"
    unit = "characters" if isinstance(like, (str, bytes)) else "items"
    return f"{what} would make a {kind} {size:,}+ {unit}; expressions are limited to {MAX_SEQUENCE:,}"


def _size(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    return f"{nbytes:.3g} TiB"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float, complex)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if value is None:
        return "None"
    return type(value).__name__


def clean_message(message: str, limit: int = 200) -> str:
    """One line of someone else's message, without Python's exception names."""
    first = next((line.strip() for line in str(message).splitlines() if line.strip()), "")
    first = _EXCEPTION_NAMES.sub("", first)
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _translate(exc: BaseException, what: str) -> str:
    """A failure inside the expression, in the user's terms (never Python's exception names)."""
    message = clean_message(str(exc))
    if isinstance(exc, ZeroDivisionError):
        return f"division by zero in {what}"
    if isinstance(exc, RecursionError):
        return "the expression nests too deeply"
    if isinstance(exc, MemoryError):
        return f"not enough memory to compute {what}"
    if isinstance(exc, OverflowError):
        if "range" in message or "too large" in message or "overflow" in message.lower():
            return f"the result of {what} is too large for a number"
        return f"in {what}: {message or 'a number is out of range'}"
    if isinstance(exc, TypeError) and "__round__" in message:
        return "round() of a tensor: use x.round()"
    if isinstance(exc, ValueError) and "integer string conversion" in message:
        return (f"the result of {what} would have more than 4300 digits; "
                f"expressions are limited to {_MAX_DIGITS_TEXT} digits")
    return f"in {what}: {message or 'the operation failed'}"


def _truth(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return bool(value.all())
        return bool(value.item())
    return bool(value)


def truth(value: Any) -> bool:
    """A condition's result as a bool: a tensor is true when all its elements are."""
    try:
        return _truth(value)
    except RewindError:
        raise
    except Exception as exc:  # noqa: BLE001 -- e.g. the truth of a meta or sparse tensor
        raise ExpressionError(f"the result cannot be read as true or false: {clean_message(str(exc))}") from None
