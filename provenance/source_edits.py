"""Source edits: a validated fix written into the user's own file, and which nodes an edited copy changed.

Agents and people fix source files, not graph nodes. Each patch of a candidate fix
(provenance/fixes.py) is expressed at the line that made its node (its innermost user frame):

- a precision: the expression on that line that made the node computes in the new dtype and is
  cast back, `torch.exp(x)` -> `torch.exp(x.to(torch.float32)).to(x.dtype)`; patched expressions
  nested in one another stay wide between them, as a patched consumer reads the wider output;
- attributes (an `eps`): the argument of the call that made the node, or the keyword of the
  constructor call that built the module it runs in (`self.norm = nn.LayerNorm(width, eps=...)`);
- a function: its definition (with the imports and names it needs) put into the file after its
  imports, and called in place of the op's expression with the op's arguments, as the patch is.

What one line cannot say (an op made inside a module call, an expression a loop runs many times
feeding itself, operands that cannot be matched to the op's tensors) is listed with why. The
result is a unified diff per file (`git apply` or `patch -p1` applies it from the current folder)
and the new text beside it; `rewind validate` checks the edited copy.
"""

from __future__ import annotations

import ast
import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from checkpoint.branch import AttributePatch, FunctionPatch, PrecisionPatch, schema_names
from hardware.program import Node, Program, Ref, collect_refs, map_refs
from provenance.births import node_dict
from provenance.fixes import Candidate, FunctionSource
from provenance.forensics import is_floating
from provenance.steps import place

NO_FIX = "no fix validated, so there is nothing to write into the source"
# The ops an operator makes, by their short names without leading underscores (`1 - x` is aten.rsub).
_OPERATORS = {ast.Add: {"add"}, ast.Sub: {"sub", "rsub"}, ast.Mult: {"mul"}, ast.Div: {"div"},
              ast.MatMult: {"matmul", "mm", "bmm"}, ast.Pow: {"pow"}, ast.FloorDiv: {"floor_divide", "div"},
              ast.Mod: {"remainder"}, ast.USub: {"neg"}, ast.Invert: {"bitwise_not", "logical_not"},
              ast.BitAnd: {"bitwise_and", "logical_and"}, ast.BitOr: {"bitwise_or", "logical_or"},
              ast.BitXor: {"bitwise_xor"}, ast.Gt: {"gt"}, ast.Lt: {"lt"}, ast.GtE: {"ge"}, ast.LtE: {"le"},
              ast.Eq: {"eq"}, ast.NotEq: {"ne"}}
_ALIASES = {"divide": {"div"}, "true_divide": {"div"}, "multiply": {"mul"}, "subtract": {"sub", "rsub"},
            "matmul": {"mm", "bmm"}, "negative": {"neg"}, "square": {"pow"}}
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)  # `.to(...)` follows them unbracketed
Render = Callable[[ast.AST], str]


class NotExpressible(Exception):
    """A patch the source cannot say at its line; the message says why."""


@dataclass
class SourceDiff:
    file: str
    old: str
    new: str
    notes: list[str] = field(default_factory=list)  # where the edit differs from the patch, in words

    @property
    def diff(self) -> str:
        """A unified diff naming the file from the current folder (by its name alone when it lies outside)."""
        relative = os.path.relpath(self.file)
        name = Path(self.file).name if relative.startswith("..") else relative
        lines = difflib.unified_diff(self.old.splitlines(True), self.new.splitlines(True), f"a/{name}", f"b/{name}")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)

    def to_dict(self) -> dict:
        return {"file": self.file, "diff": self.diff, "notes": self.notes}


@dataclass
class SourceEdits:
    diffs: list[SourceDiff]
    not_expressed: list[dict]  # {"node", "op", "kind", "why"}

    def to_dict(self) -> dict:
        return {"sourceDiffs": [d.to_dict() for d in self.diffs], "notInSource": self.not_expressed}


def source_fields(program: Program, fix: Candidate | None) -> dict:
    """What a repair verdict says of the source: the validated fix's diffs, and the patches they leave out."""
    if fix is None:
        return {"sourceDiffs": None, "sourceDiffsReason": NO_FIX, "notInSource": []}
    return source_edits(program, fix).to_dict()


def source_edits(program: Program, fix: Candidate) -> SourceEdits:
    """The fix's patches as edits of the files that made their nodes."""
    files = _Files(program)
    _training_loop(files, fix)
    patches = [p for p in fix.patches if program.nodes[p.node].phase == "forward"]
    precision = [p for p in patches if isinstance(p, PrecisionPatch)]
    if precision:
        _Precision(files).express(precision)
    for patch in patches:
        node = program.nodes[patch.node]
        try:
            if isinstance(patch, FunctionPatch):
                _function(files, node, fix.sources.get(patch.node))
            elif isinstance(patch, AttributePatch):
                _attributes(files, node, patch)
            elif not isinstance(patch, PrecisionPatch):
                raise NotExpressible("a value edit changes the pass's data, not its code: an experiment, not a fix")
        except NotExpressible as exc:
            files.refuse(node, patch.kind, exc)
    diffs = [SourceDiff(f.file, f.text, f.render(), f.notes) for f in files.edited()]
    return SourceEdits([d for d in diffs if d.new != d.old], files.refused)


def _training_loop(files: _Files, fix: Candidate) -> None:
    """What a fix changes in Rewind's training loop (an edit inserting nodes, patches of the optimizer's update) is
    no line of the user's file: said once, with how their own loop or optimizer says it."""
    program = files.program
    if fix.edit is not None:
        files.refused.append({"node": "the training loop", "op": fix.edit.kind, "kind": "program",
                              "why": f"{fix.edit.describe()}: nodes of Rewind's training loop; in your own loop, "
                                     f"{fix.edit.to_dict()['inSource']}"})
    for p in fix.patches:
        node = program.nodes[p.node]
        forward = program.forward_node(node)
        if forward is not None:
            files.refused.append({"node": node.name, "op": node.op, "kind": p.kind,
                                  "why": f"a node of the backward of `{forward.op_short.removeprefix('aten.')}`, which "
                                         "autograd derives from your forward: change the forward so that its gradient "
                                         "is what this patch computes (the finding's fix says how)"})
    update = [p for p in fix.patches if program.nodes[p.node].phase == "optimizer"]
    if update:
        first = program.nodes[update[0].node]
        loc = place(program, first)
        made = f" at {Path(loc.file).name}:{loc.line}" if loc else ""
        files.refused.append({"node": first.name, "op": first.op, "kind": update[0].kind,
                              "why": f"{len(update)} node(s) of the {program.optimizer or 'optimizer'} update, which "
                                     f"Rewind writes from the optimizer made{made}: change the optimizer there "
                                     "(its hyperparameters, or its state's dtype)"})


# -- which nodes an edited copy changed --------------------------------------------------------------------

def graph_changes(original: Program, fixed: Program) -> dict:
    """The original's nodes against the edited copy's, each known by its op, module, source line text, constant
    arguments and output dtypes (an edit renames nodes and moves lines): the runs of nodes that differ."""
    a = [_signature(original, n) for n in original.nodes]
    b = [_signature(fixed, n) for n in fixed.nodes]
    words = {"replace": "changed", "delete": "removed", "insert": "added"}
    hunks, same = [], 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            same += i2 - i1
        else:
            hunks.append({"change": words[tag], "original": [_described(original, n) for n in original.nodes[i1:i2]],
                          "fixed": [_described(fixed, n) for n in fixed.nodes[j1:j2]]})
    return {"hunks": hunks, "unchanged": same}


def _signature(program: Program, node: Node) -> tuple:
    constants = repr(map_refs((node.args, node.kwargs), lambda r: "·"))
    return (node.op, node.module_path, line_text(program, node), constants,
            tuple(program.values[o].dtype for o in node.outputs))


def _described(program: Program, node: Node) -> dict:
    return {**node_dict(node), "module": node.module_path, "text": line_text(program, node)}


def line_text(program: Program, node: Node) -> str:
    """The source line that made the node, stripped ("" when it has none)."""
    if node.loc is None:
        return ""
    lines = program.source_files.get(node.loc.file, "").splitlines()
    return lines[node.loc.line - 1].strip() if 0 < node.loc.line <= len(lines) else ""


# -- one file's text and the edits made to it ---------------------------------------------------------------

class _FileEdit:
    """A source file parsed once. Edits wrap an expression in text, replace it, or add keywords to a call;
    rendering splices them into the text, so everything not edited keeps its characters and comments."""

    def __init__(self, file: str, text: str):
        self.file, self.text = file, text
        try:
            self.tree = ast.parse(text)
        except SyntaxError as exc:
            raise NotExpressible(f"{Path(file).name} does not parse ({exc.msg})") from None
        self._starts = [0]
        for line in text.splitlines(True):
            self._starts.append(self._starts[-1] + len(line))
        self.parent: dict[ast.AST, ast.AST] = {}
        self._order: list[ast.expr] = []  # in evaluation order: operands before their operation
        self._walk(self.tree)
        self.imported = _imports(self.tree.body)
        self.wraps: dict[ast.AST, list[tuple[str, str]]] = {}
        self.replaced: dict[ast.AST, Callable[[Render], str]] = {}
        self.keywords: dict[ast.Call, dict[str, str]] = {}  # keywords added to a call
        self.added: list[str] = []  # imports and definitions put in after the file's imports
        self.notes: list[str] = []
        self._texts: dict[ast.AST, str] = {}

    def _walk(self, node: ast.AST) -> None:
        for child in _children(node):
            self.parent[child] = node
            self._walk(child)
        if isinstance(node, ast.expr):
            self._order.append(node)

    def at_line(self, line: int) -> list[ast.expr]:
        return [e for e in self._order if e.lineno == line]

    def line(self, line: int) -> str:
        return self.text[self._starts[line - 1]:self._starts[line]].strip() if line < len(self._starts) else ""

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self._offset(node.lineno, node.col_offset), self._offset(node.end_lineno, node.end_col_offset)

    def _offset(self, line: int, column: int) -> int:
        """A character offset from ast's (line, column in UTF-8 bytes)."""
        start = self._starts[line - 1]
        return start + len(self.text[start:self._starts[line]].encode()[:column].decode(errors="replace"))

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def torch_name(self) -> str:
        """How the file names torch (`import torch` is added when it does not import it)."""
        for name, what in self.imported.items():
            if what == "torch":
                return name
        self.add("import torch")
        self.imported["torch"] = "torch"
        return "torch"

    def add(self, text: str) -> None:
        if text not in self.added:
            self.added.append(text)

    def wrap(self, expr: ast.expr, suffix: str) -> None:
        prefix, close = ("", "") if isinstance(expr, _ATOMS) else ("(", ")")
        self.wraps.setdefault(expr, []).append((prefix, close + suffix))

    def replace(self, expr: ast.AST, make: Callable[[Render], str], what: str) -> None:
        """Replace `expr` by what `make` renders; `what` tells two replacements apart (the same one is kept)."""
        if self._texts.get(expr, what) != what:
            raise NotExpressible(f"`{self.segment(expr)}` (line {expr.lineno}) is edited by another patch too")
        self.replaced[expr], self._texts[expr] = make, what

    def keyword(self, call: ast.Call, name: str, text: str) -> None:
        added = self.keywords.setdefault(call, {})
        if added.get(name, text) != text:
            raise NotExpressible(f"two patches set {name} of `{self.segment(call)}` to different values")
        added[name] = text

    def changed(self) -> bool:
        return bool(self.wraps or self.replaced or self.keywords or self.added)

    def render(self) -> str:
        wraps = {**self.wraps}
        self._insert_added(wraps)
        touched: set[ast.AST] = set()
        for node in [*wraps, *self.replaced, *self.keywords]:
            while node is not None and node not in touched:
                touched.add(node)
                node = self.parent.get(node)

        def render(node: ast.AST) -> str:
            body = self.replaced[node](render) if node in self.replaced else splice(node)
            if node in self.keywords:
                body = _with_keywords(body, self.keywords[node])
            for prefix, suffix in wraps.get(node, ()):
                body = prefix + body + suffix
            return body

        def splice(node: ast.AST) -> str:
            start, end = (0, len(self.text)) if node is self.tree else self.span(node)
            out, at = [], start
            for child in _children(node):
                if child in touched:
                    s, e = self.span(child)
                    out += [self.text[at:s], render(child)]
                    at = e
            return "".join(out) + self.text[at:end]

        return render(self.tree)

    def _insert_added(self, wraps: dict) -> None:
        """Imports after the file's last top-level import, then definitions, two blank lines around each."""
        imports = [t for t in self.added if t.startswith(("import ", "from "))]
        text = "".join("\n" + t for t in imports) + "".join("\n\n\n" + t for t in self.added if t not in imports)
        if not text:
            return
        anchor = next((s for s in reversed(self.tree.body) if isinstance(s, (ast.Import, ast.ImportFrom))), None)
        if anchor is not None:
            wraps[anchor] = [*wraps.get(anchor, []), ("", text)]
        else:
            first = self.tree.body[0]
            wraps[first] = [(text.lstrip("\n") + "\n\n\n", ""), *wraps.get(first, [])]


def _children(node: ast.AST) -> Iterator[ast.AST]:
    """Child nodes with a place in the text (looking through those without one, such as `arguments`)."""
    for child in ast.iter_child_nodes(node):
        if getattr(child, "end_col_offset", None) is not None:
            yield child
        else:
            yield from _children(child)


def _with_keywords(call: str, keywords: dict[str, str]) -> str:
    head = call[:-1].rstrip()
    added = ", ".join(f"{k}={v}" for k, v in keywords.items())
    joiner = "" if head.endswith("(") else " " if head.endswith(",") else ", "
    return f"{head}{joiner}{added})"


def _imports(body: list[ast.stmt]) -> dict[str, str]:
    """Top-level names bound by imports -> what they import (`F` -> `torch.nn.functional`)."""
    bound = {}
    for stmt in body:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(stmt, ast.ImportFrom):
            for a in stmt.names:
                bound[a.asname or a.name] = f"{'.' * stmt.level}{stmt.module or ''}.{a.name}"
    return bound


class _Files:
    """The files a fix edits, each parsed once, and the patches refused so far."""

    def __init__(self, program: Program):
        self.program = program
        self._files: dict[str, _FileEdit] = {}
        self.refused: list[dict] = []

    def refuse(self, node: Node, kind: str, exc: NotExpressible) -> None:
        self.refused.append({"node": node.name, "op": node.op, "kind": kind, "why": str(exc)})

    def edited(self) -> list[_FileEdit]:
        return [f for f in self._files.values() if f.changed()]

    def of(self, file: str) -> _FileEdit:
        if file not in self._files:
            text = self.program.source_files.get(file)
            if text is None:
                raise NotExpressible(f"its source file {Path(file).name} could not be read")
            self._files[file] = _FileEdit(file, text)
        return self._files[file]

    def site(self, node: Node) -> tuple[_FileEdit, ast.expr]:
        """The file, and the expression in it, that made `node`."""
        if node.loc is None:
            raise NotExpressible("torch.export recorded no source line for it")
        if any(part in ("site-packages", "dist-packages") for part in Path(node.loc.file).parts):
            raise NotExpressible(f"a library's code makes it ({Path(node.loc.file).name}:{node.loc.line}), not yours")
        edit = self.of(node.loc.file)
        path, cls = node.module_stack[-1] if node.module_stack else ("", "")
        if path and cls.startswith("torch."):  # the line calls the module; torch's code makes the op
            raise NotExpressible(f"torch's {cls.rsplit('.', 1)[-1]} module '{path}' makes it, called at line "
                                 f"{node.loc.line} `{edit.line(node.loc.line)}`, not an expression of yours")
        return edit, _made_by(self.program, edit, node)


# -- the expression that made a node ---------------------------------------------------------------------------

def _made_by(program: Program, edit: _FileEdit, node: Node) -> ast.expr:
    """The one expression on the node's line spelling its op; with several, the one in the same place of the
    line's evaluation order as the node among the pass's nodes of that op made at that line."""
    line, word = node.loc.line, node.op_short.split(".")[-1].lstrip("_")
    found = [e for e in edit.at_line(line) if _spells(e, word)]
    same = [n.index for n in program.nodes if n.op == node.op and n.loc == node.loc]
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotExpressible(f"no expression on line {line} `{edit.line(line)}` makes {node.op_short}")
    if len(found) == len(same):
        return found[same.index(node.index)]
    raise NotExpressible(f"line {line} `{edit.line(line)}` has {len(found)} expressions making {node.op_short} and "
                         f"the pass ran it {len(same)} times there: which one made {node.name} is not known")


def _spells(expr: ast.expr, word: str) -> bool:
    """Does `expr` make an op called `word`: `torch.exp(x)`, `x.exp()`, `a / b` for div?"""
    if isinstance(expr, (ast.BinOp, ast.UnaryOp)):
        return word in _OPERATORS.get(type(expr.op), set())
    if isinstance(expr, ast.Compare):
        return len(expr.ops) == 1 and word in _OPERATORS.get(type(expr.ops[0]), set())
    name = _called(expr) if isinstance(expr, ast.Call) else ""
    return bool(name) and (word == name.lstrip("_") or word in _ALIASES.get(name, set()))


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _arguments(edit: _FileEdit, expr: ast.expr) -> tuple[list[ast.expr], list[ast.expr]]:
    """The expression's positional arguments, in the order the op takes them (a method's object first), and the
    values of its keywords."""
    if isinstance(expr, ast.BinOp):
        return [expr.left, expr.right], []
    if isinstance(expr, ast.UnaryOp):
        return [expr.operand], []
    if isinstance(expr, ast.Compare):
        return [expr.left, *expr.comparators], []
    if any(isinstance(a, ast.Starred) for a in expr.args) or any(k.arg is None for k in expr.keywords):
        raise NotExpressible(f"`{edit.segment(expr)}` passes its arguments with * or **")
    func = expr.func
    method = isinstance(func, ast.Attribute) and _root(func.value) not in edit.imported
    return [func.value] * method + list(expr.args), [k.value for k in expr.keywords]


def _root(expr: ast.expr) -> str | None:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _is_literal(expr: ast.expr) -> bool:
    """A constant written out: `2`, `-1`, `(16,)`, `float("-inf")`."""
    if isinstance(expr, ast.Constant):
        return True
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
        return _is_literal(expr.operand)
    if isinstance(expr, (ast.Tuple, ast.List)):
        return all(_is_literal(e) for e in expr.elts)
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("float", "int")
            and all(isinstance(a, ast.Constant) for a in expr.args) and not expr.keywords)


def _paired(edit: _FileEdit, expr: ast.expr, node: Node) -> list[tuple[ast.expr, str]]:
    """Each operand of `expr` with the value it is: the op's tensors, one per place. Its operands that are not
    written-out constants, in order; or else, where the source passes the op's arguments one for one (`a / scale`
    with scale a Python number), those in the places the op takes a tensor."""
    tensors = _tensors((node.args, tuple(node.kwargs.values())))
    positional, keywords = _arguments(edit, expr)
    operands = [e for e in positional + keywords if not _is_literal(e)]
    if len(operands) != len(tensors) and all(map(_is_literal, keywords)) and len(positional) == len(node.args):
        order = positional[::-1] if node.op_short == "aten.rsub" else positional  # `c - x` is rsub(x, c)
        operands = [e for e, a in zip(order, node.args) if isinstance(a, Ref)]
    if len(operands) != len(tensors):
        raise NotExpressible(f"`{edit.segment(expr)}` (line {expr.lineno}) has {len(operands)} operand(s) that are "
                             f"not constants and {node.op_short} takes {len(tensors)} tensor(s): which is which is "
                             "not known")
    return list(zip(operands, tensors))


def _tensors(args: Any) -> list[str]:
    """The values among arguments, one per place they take (`x * x` takes x twice), in order."""
    found: list[str] = []
    collect_refs(args, found)
    return found


def _literal(value: Any, edit: _FileEdit) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        items = [_literal(v, edit) for v in value]
        return f"[{', '.join(items)}]" if isinstance(value, list) else f"({', '.join(items)}{',' * (len(items) == 1)})"
    if isinstance(value, torch.dtype):
        return f"{edit.torch_name()}.{str(value).removeprefix('torch.')}"
    raise NotExpressible(f"its argument {value!r} has no spelling as a constant")


# -- precision at a line ------------------------------------------------------------------------------------

@dataclass
class _Wide:
    """A patched expression: the nodes it made, their dtype, and its operands with their values."""

    edit: _FileEdit
    nodes: list[Node]
    dtype: str
    pairs: list[tuple[ast.expr, str]] = field(default_factory=list)


class _Precision:
    """Each patched expression's operands cast to the dtype, and its result cast back unless a patched expression
    takes it as an operand: nested patched expressions stay wide between them, as on a branch."""

    def __init__(self, files: _Files):
        self.files, self.program = files, files.program

    def express(self, patches: list[PrecisionPatch]) -> None:
        wide: dict[ast.expr, _Wide] = {}
        for p in patches:
            node = self.program.nodes[p.node]
            try:
                edit, expr = self.files.site(node)
                site = wide.setdefault(expr, _Wide(edit, [], p.dtype))
                if site.dtype != p.dtype:
                    raise NotExpressible(f"line {expr.lineno} makes it and other nodes patched to {site.dtype}")
                site.nodes.append(node)
            except NotExpressible as exc:
                self.files.refuse(node, p.kind, exc)
        for expr, site in list(wide.items()):
            try:
                site.pairs = self._operands(expr, site)
            except NotExpressible as exc:
                del wide[expr]
                for node in site.nodes:
                    self.files.refuse(node, "precision", exc)
        for expr, site in wide.items():
            self._cast(expr, site, wide)

    def _operands(self, expr: ast.expr, site: _Wide) -> list[tuple[ast.expr, str]]:
        made = {o for n in site.nodes for o in n.outputs}
        fed = next((n for n in site.nodes if made & set(n.input_names())), None)
        if fed is not None:
            raise NotExpressible(f"the pass runs `{site.edit.segment(expr)}` (line {expr.lineno}) {len(site.nodes)} "
                                 f"times, each reading the last one's result through a variable ({fed.name}): the "
                                 f"source cannot keep that running value in {site.dtype} at this line")
        if any(len(n.outputs) != 1 for n in site.nodes):
            raise NotExpressible(f"{site.nodes[0].op_short} returns several values")
        pairs = [_paired(site.edit, expr, n) for n in site.nodes]  # each run of the line (a loop, a layer)
        kinds = {tuple((o, self.program.values[v].dtype) for o, v in p) for p in pairs}
        if len(kinds) > 1:
            raise NotExpressible(f"the nodes line {expr.lineno} makes take operands of different dtypes")
        return pairs[0]

    def _cast(self, expr: ast.expr, site: _Wide, wide: dict[ast.expr, _Wide]) -> None:
        edit, values = site.edit, self.program.values
        back = values[site.nodes[0].outputs[0]].dtype
        if not is_floating(back):
            return  # a mask, an index: nothing to compute wider
        runs = [n for n in self.program.nodes if n.op == site.nodes[0].op and n.loc == site.nodes[0].loc]
        if len(runs) > len(site.nodes):
            edit.notes.append(f"line {expr.lineno} makes {site.nodes[0].op_short} {len(runs)} times (a loop, a layer "
                              f"used again): the fix widens {len(site.nodes)} of them, the edit every one")
        patched = {n.name for s in wide.values() for n in s.nodes}
        for operand, value in site.pairs:
            info = values[value]
            if (operand in wide and wide[operand].dtype == site.dtype) or not is_floating(info.dtype):
                continue
            edit.wrap(operand, f".to({edit.torch_name()}.{site.dtype})")
            if info.producer is not None and self.program.nodes[info.producer].name in patched:
                edit.notes.append(f"line {expr.lineno} reads {value} rounded to {info.dtype} where the fix kept it in "
                                  f"{site.dtype} (it passes through a variable)")
        taker = next((e for e, s in wide.items() if any(o is expr for o, _ in s.pairs)), None)
        if taker is None or wide[taker].dtype != site.dtype:
            edit.wrap(expr, f".to({self._named_dtype(expr, back, wide) or f'{edit.torch_name()}.{back}'})")

    def _named_dtype(self, expr: ast.expr, dtype: str, wide: dict[ast.expr, _Wide]) -> str | None:
        """`x.dtype` for a plainly named operand of the patched expression(s) with the dtype to cast back to."""
        for operand, value in wide[expr].pairs:
            if operand in wide:
                found = self._named_dtype(operand, dtype, wide)
                if found:
                    return found
            elif isinstance(operand, (ast.Name, ast.Attribute)) and _root(operand) and \
                    self.program.values[value].dtype == dtype:
                return f"{wide[expr].edit.segment(operand)}.dtype"
        return None


# -- a function in place of an op ---------------------------------------------------------------------------

def _function(files: _Files, node: Node, source: FunctionSource | None) -> None:
    if source is None:
        raise NotExpressible("the function's source is not known")
    edit, expr = files.site(node)
    operands = iter([operand for operand, _ in _paired(edit, expr, node)])
    if any(isinstance(a, (list, tuple)) and _tensors(a) for a in node.args):
        raise NotExpressible(f"{node.op_short} takes a list of tensors")
    parts = [("", next(operands) if isinstance(a, Ref) else _literal(a, edit)) for a in node.args]
    parts += [(f"{k}=", next(operands) if isinstance(v, Ref) else _literal(v, edit)) for k, v in node.kwargs.items()]
    _define(edit, source)

    def call(render: Render) -> str:
        return f"{source.function}({', '.join(k + (p if isinstance(p, str) else render(p)) for k, p in parts)})"

    edit.replace(expr, call, f"{source.file}:{source.function}")


def _define(edit: _FileEdit, source: FunctionSource) -> None:
    """Put the function and what it uses of its module (imports, constants, helpers) into the file, each once;
    a name the file already binds to something else is a clash, said in words."""
    tree = ast.parse(source.text)
    top = {name: stmt for stmt in tree.body for name in _binds(stmt)}
    if source.function not in top:
        raise NotExpressible(f"{Path(source.file).name} defines no function '{source.function}'")
    needed, wanted = [], [source.function]
    while wanted:
        name = wanted.pop()
        if name in top and name not in needed:
            needed.append(name)
            wanted += [n.id for n in ast.walk(top[name]) if isinstance(n, ast.Name)]
    lines, mine = source.text.splitlines(), {name: stmt for stmt in edit.tree.body for name in _binds(stmt)}
    theirs = _imports(tree.body)
    imports, texts = {}, []  # put in only once every name is known to fit
    for name in sorted(needed, key=lambda n: top[n].lineno):
        stmt = top[name]
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if edit.imported.get(name, theirs[name]) != theirs[name]:
                raise NotExpressible(f"{Path(edit.file).name} imports '{name}' as something else")
            if name not in edit.imported:
                imports[name] = theirs[name]
                texts.append(_import_text(stmt, name))
        elif name in mine:
            if edit.segment(mine[name]) != ast.get_source_segment(source.text, stmt):
                raise NotExpressible(f"{Path(edit.file).name} already defines '{name}' (line {mine[name].lineno})")
        else:
            first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
            texts.append("\n".join(lines[first - 1:stmt.end_lineno]))
    edit.imported.update(imports)
    for text in texts:
        edit.add(text)


def _binds(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return list(_imports([stmt]))
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _import_text(stmt: ast.Import | ast.ImportFrom, name: str) -> str:
    """The import of `name` alone, out of a statement that may import several names."""
    for alias in stmt.names:
        single = (ast.Import(names=[alias]) if isinstance(stmt, ast.Import)
                  else ast.ImportFrom(module=stmt.module, names=[alias], level=stmt.level))
        if name in _imports([single]):
            return ast.unparse(single)
    raise NotExpressible(f"the import of '{name}' was not found")


# -- attributes: an argument of the call, or a keyword of the module's constructor -------------------------------

def _attributes(files: _Files, node: Node, patch: AttributePatch) -> None:
    try:
        edit, call = files.site(node)
    except NotExpressible:
        edit, call = None, None
    schema = schema_names(node)
    if isinstance(call, ast.Call):  # F.layer_norm(x, shape, eps=0.0): the op's own call
        method = isinstance(call.func, ast.Attribute) and _root(call.func.value) not in edit.imported
        for name, value in patch.changes:
            position = schema.index(name) - method
            if position < len(call.args):
                edit.replace(call.args[position], lambda render, t=_literal(value, edit): t, _literal(value, edit))
            else:
                _keyword(edit, call, name, _literal(value, edit))
        return
    edit, call = _constructor(files, node)
    for name, value in patch.changes:
        _takes(files, _called(call), name)
        _keyword(edit, call, name, _literal(value, edit))


def _keyword(edit: _FileEdit, call: ast.Call, name: str, text: str) -> None:
    given = next((k for k in call.keywords if k.arg == name), None)
    if given is not None:
        edit.replace(given.value, lambda render: text, text)
    else:
        edit.keyword(call, name, text)


def _constructor(files: _Files, node: Node) -> tuple[_FileEdit, ast.Call]:
    """The call that built the module `node` runs in: `self.<attribute> = <Class>(...)` in its parent's class
    (found in any of the program's source files); a class of the user's must take the keyword."""
    if node.loc is None or len(node.module_stack) < 2:
        raise NotExpressible("no call of yours makes it, and it runs in no module built in your code")
    (parent_path, parent_cls), (path, cls) = node.module_stack[-2:]
    attribute = path.removeprefix(parent_path + "." if parent_path else "").split(".")[0]
    short, parent = cls.rsplit(".", 1)[-1], parent_cls.rsplit(".", 1)[-1]
    for file in files.program.source_files:
        try:
            edit = files.of(file)
        except NotExpressible:
            continue
        call = _built(edit, parent, attribute, short)
        if call is not None:
            return edit, call
    raise NotExpressible(f"the call that builds {path} (`self.{attribute} = {short}(...)` in class {parent}) was "
                         "not found")


def _built(edit: _FileEdit, parent: str, attribute: str, cls: str) -> ast.Call | None:
    for klass in ast.walk(edit.tree):
        if not (isinstance(klass, ast.ClassDef) and klass.name == parent):
            continue
        for stmt in ast.walk(klass):
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            calls = [c for c in ast.walk(stmt.value) if isinstance(c, ast.Call) and _called(c) == cls]
            if any(isinstance(t, ast.Attribute) and t.attr == attribute for t in targets) and len(calls) == 1:
                return calls[0]
    return None


def _takes(files: _Files, cls: str, name: str) -> None:
    """A class of the user's (one defined in the program's source files) must take the keyword; torch's own
    modules take their op's attribute under its name (LayerNorm's eps)."""
    for file in files.program.source_files:
        try:
            tree = files.of(file).tree
        except NotExpressible:
            continue
        for klass in ast.walk(tree):
            if isinstance(klass, ast.ClassDef) and klass.name == cls:
                init = next((f for f in klass.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
                a = init.args if init else None  # none: it takes its parent class's, unknown here
                if a is not None and not (a.kwarg or name in [p.arg for p in a.args + a.kwonlyargs]):
                    raise NotExpressible(f"{cls}'s constructor takes no {name} ({Path(file).name}:{klass.lineno})")
                return
