"""Source variable names: `scores`, `q`, `hidden_states` as the user wrote them, bound to Program values.

torch.export names values after ops (`div_1`). The user reads their own names. Each user source file is parsed
once; each frame instance (one call of a function: a module's `forward` in `blocks.1.attn`, a helper called from
it) is followed statement by statement, as Python would run it:

- a statement whose line runs nodes binds its targets to what its expression computed: the outputs of the line's
  last node, or, when the expression is a call into another frame (a submodule), what that frame returned
  (`attn_output, _ = self.attn(x)` unpacks the callee's `return out, weights`);
- a statement that runs no node is followed by name: `residual = hidden_states` (an alias),
  `hidden_states = outputs[0]` (an element of a tuple or of a ModelOutput the callee built),
  `x = outputs.last_hidden_state`; such a statement counts as run when it sits between two statements that
  ran, in the same block as one of them or in a block around it;
- a frame's parameters are bound when it starts: from the call's arguments as the caller's names give them,
  else from the value flowing into the frame's first node; the outermost frame's from the Program's inputs.

A binding is a Program value (str), a tuple or a dict of bindings (what a call returned), or None: the name
holds something Rewind does not follow (a shape, a dtype, None, a value it cannot tell).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from hardware.line_executions import LineExecutions
from hardware.program import Frame, Node, Program

Binding = Any  # str | tuple | dict | None, as the module docstring says

# Methods that give back their receiver when export recorded no node for them (`.to()` to the same dtype).
_IDENTITY_METHODS = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "contiguous",
                               "detach", "clone", "cpu", "cuda", "requires_grad_"})
_NOT_FOLLOWED = ("parameter", "buffer", "constant")  # values that do not flow into a frame from its caller
_BLOCK_FIELDS = ("body", "orelse", "finalbody")


@dataclass(frozen=True)
class Assignment:
    node: int  # index of the node whose outputs the names receive
    frame: tuple  # the frame instance (file, function, module_path) of the assigning line
    names: dict[str, str]  # source name -> value name


def frame_instance(frame: Frame) -> tuple:
    return (frame.loc.file, frame.loc.function, frame.module_path)


@functools.lru_cache(maxsize=64)
def parse_source(source: str | None) -> ast.Module | None:
    """The syntax tree of a user source file (parsed once), None if it does not parse."""
    if source is None:
        return None
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


# -- a function's syntax --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Parameter:
    name: str
    default: bool  # has a default value
    kind: str  # "positional", "keyword" (keyword-only), "variadic" (*args, **kwargs)


class Function:
    """One `def`: its parameters, its statements in source order and the blocks each sits in."""

    def __init__(self, node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool):
        self.node = node
        self.name = node.name
        a = node.args
        positional = list(a.posonlyargs) + list(a.args)
        defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
        params = [Parameter(p.arg, d, "positional") for p, d in zip(positional, defaults)]
        if method and params and params[0].name in ("self", "cls"):
            params = params[1:]
        params += [Parameter(p.arg, d is not None, "keyword") for p, d in zip(a.kwonlyargs, a.kw_defaults)]
        params += [Parameter(p.arg, True, "variadic") for p in (a.vararg, a.kwarg) if p is not None]
        self.params = params
        self.stmts: list[ast.stmt] = []
        self.chains: list[tuple] = []  # per statement: the blocks around it, outermost first ((index, field), ...)
        self._walk(node.body, ())
        self.at_line: dict[int, int] = {}  # line -> the innermost statement there
        for i, stmt in enumerate(self.stmts):  # pre-order: an inner statement overwrites its block's lines
            for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1):
                self.at_line[line] = i
        names = {p.name for p in params}
        for stmt in self.stmts:
            for target in _targets_of(stmt):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        self.names = frozenset(names)
        self.first_line: dict[str, int] = {}  # name -> the first line that assigns it
        for stmt in self.stmts:
            for target in _targets_of(stmt):
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        self.first_line.setdefault(n.id, stmt.lineno)

    def _walk(self, body: list[ast.stmt], chain: tuple) -> None:
        for stmt in body:
            index = len(self.stmts)
            self.stmts.append(stmt)
            self.chains.append(chain)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue  # a nested definition runs in frames of its own
            for name in _BLOCK_FIELDS:
                block = getattr(stmt, name, None)
                if block and isinstance(block, list) and isinstance(block[0], ast.stmt):
                    self._walk(block, chain + ((index, name),))
            for k, handler in enumerate(getattr(stmt, "handlers", None) or ()):
                self._walk(handler.body, chain + ((index, f"handler{k}"),))
            for k, case in enumerate(getattr(stmt, "cases", None) or ()):
                self._walk(case.body, chain + ((index, f"case{k}"),))

    def statement(self, line: int) -> int | None:
        return self.at_line.get(line)

    def _around(self, k: int, i: int) -> bool:
        """Is statement k in the block of statement i or in a block around it?"""
        return 0 <= i and self.chains[i][: len(self.chains[k])] == self.chains[k]

    def between(self, i: int, j: int) -> list[int]:
        """Assignments that run no node and must have run between statement i (-1: the start) and statement j
        (len: the end): each sits in the block of i or j, or in a block around one of them."""
        if j <= i:
            return []  # a loop went back: what ran on the way is not known
        return [k for k in range(i + 1, min(j, len(self.stmts)))
                if isinstance(self.stmts[k], (ast.Assign, ast.AnnAssign, ast.AugAssign))
                and (self._around(k, i) or (j < len(self.stmts) and self._around(k, j))
                     or (i < 0 and not self.chains[k]))]

    def return_after(self, i: int) -> int | None:
        """The return statement that ends a run whose last statement with nodes is i."""
        if 0 <= i < len(self.stmts) and isinstance(self.stmts[i], ast.Return):
            return i
        for k in range(i + 1, len(self.stmts)):
            if isinstance(self.stmts[k], ast.Return) and (self._around(k, i) or (i < 0 and not self.chains[k])):
                return k
        return None


def _targets_of(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return list(stmt.targets)
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return [stmt.target]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.target]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [item.optional_vars for item in stmt.items if item.optional_vars is not None]
    return []


def _definitions(tree: ast.Module) -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every `def` of a file, by name."""
    out: dict[str, list] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, []).append(node)
    return out


def _find_function(definitions: dict[str, list], line: int, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost `def name` whose body holds `line`."""
    best = None
    for node in definitions.get(name, ()):
        if node.lineno <= line <= (node.end_lineno or node.lineno) and (best is None or node.lineno > best.lineno):
            best = node
    return best


def _calls(stmt: ast.stmt) -> list[ast.Call]:
    """The calls a statement makes (its header only, for a compound one), in the order Python makes them."""
    out: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        for name, child in ast.iter_fields(node):
            if name in _BLOCK_FIELDS + ("handlers", "cases", "decorator_list"):
                continue
            for item in child if isinstance(child, list) else [child]:
                if isinstance(item, ast.AST) and not isinstance(item, (ast.Lambda, ast.FunctionDef, ast.ClassDef,
                                                                       ast.AsyncFunctionDef, ast.stmt)):
                    visit(item)
        if isinstance(node, ast.Call):
            out.append(node)

    visit(stmt)
    return out


def _value_of(stmt: ast.stmt | None) -> ast.expr | None:
    return getattr(stmt, "value", None) if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return,
                                                           ast.Expr)) else None


def _terminal(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


# -- frame instances ----------------------------------------------------------------------------------------------
@dataclass
class Event:
    after: int  # the node index after which the binding holds (-1: from the start)
    name: str
    binding: Binding
    line: int  # the line that bound it


@dataclass
class Instance:
    """One call of a function: the nodes it ran (its callees' included), and the names it bound, in order."""

    id: int
    level: int  # its index in node.frames (0: the outermost frame)
    frame: Frame  # as its first node saw it
    parent: int | None
    first: int  # node indices
    last: int
    nodes: list[int] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    function: Function | None = None
    arguments: dict[str, Binding] = field(default_factory=dict)  # parameter -> what the call passed
    events: list[Event] = field(default_factory=list)
    returned: Binding = None

    @property
    def title(self) -> str:
        """`LlamaRMSNorm.forward [model.norm]`, as the stack shows it."""
        f = self.frame
        where = f.module_path if f.module_path is not None else ""
        return f"{f.module_class or ''}.{f.loc.function} [{where or '<root>'}]".lstrip(".")

    def names(self) -> frozenset[str]:
        """Every name the function binds: its parameters and assignment targets."""
        return self.function.names if self.function is not None else frozenset()


@dataclass
class _Run:
    """Consecutive nodes of one instance that run one statement (one iteration of it, in a loop)."""

    stmt: int | None
    key: Any
    first: int
    last: int
    children: list[int] = field(default_factory=list)
    calls: dict[int, int] = field(default_factory=dict)  # id of an ast.Call -> the child instance it made


class SourceScopes:
    """Every frame instance of a Program and the names each binds, with the node after which each holds."""

    def __init__(self, program: Program):
        self.program = program
        nodes = program.nodes
        self.instances: list[Instance] = []
        self.node_instances: list[tuple[int, ...]] = [()] * len(nodes)  # per node: its instances, outermost first
        self._functions: dict[tuple, Function | None] = {}
        self._definitions: dict[str, dict[str, list]] = {}  # file -> its defs by name
        self._targets = {info.target: name for name, info in program.values.items()
                         if info.kind in _NOT_FOLLOWED and info.target}
        self._build_instances(nodes)
        self.names: frozenset[str] = frozenset().union(*(i.names() for i in self.instances)) if self.instances \
            else frozenset()
        self.assignments: list[Assignment] = []
        for inst in self.instances:
            if inst.parent is None:
                self._process(inst, self._root_arguments(inst))

    # -- instances -------------------------------------------------------------------------------------------
    def _build_instances(self, nodes: list[Node]) -> None:
        open_ids: list[int] = []
        prev: tuple[Frame, ...] = ()
        last_framed = -1
        forward_ids: list[int] = []  # the instances of the step's last forward node with frames
        for n, node in enumerate(nodes):
            if node.phase != "forward":  # a training step's backward and update: the step's calls are over
                if node.differentiates is not None:  # seen in the frames of the forward node it differentiates
                    self.node_instances[n] = self.node_instances[node.differentiates]
                elif node.frames:  # an update at the user's opt.step(): in the frames its forward ran in
                    self.node_instances[n] = self._continued(node.frames, forward_ids)
                open_ids, prev, last_framed = [], (), -1
                continue
            frames = node.frames
            if not frames:
                continue  # a node without a source frame neither opens nor closes one
            ids: list[int] = []
            for level, f in enumerate(frames):
                same = (level < len(open_ids) and self.instances[open_ids[level]].last == last_framed
                        and frame_instance(self.instances[open_ids[level]].frame) == frame_instance(f)
                        and (level == 0 or (ids[level - 1] == open_ids[level - 1]
                                            and prev[level - 1].loc.line == frames[level - 1].loc.line)))
                if same:
                    inst = self.instances[open_ids[level]]
                else:
                    parent = ids[level - 1] if level else None
                    inst = Instance(len(self.instances), level, f, parent, n, n,
                                    function=self._function(f))
                    self.instances.append(inst)
                    if parent is not None:
                        self.instances[parent].children.append(inst.id)
                inst.last = n
                inst.nodes.append(n)
                ids.append(inst.id)
            self.node_instances[n] = tuple(ids)
            open_ids, prev, last_framed = ids, frames, n
            forward_ids = ids

    def _continued(self, frames: tuple[Frame, ...], forward_ids: list[int]) -> tuple[int, ...]:
        """The instances a node after the forward (an update the user's step function made) runs in: those of the
        forward's frames it shares, all of its frames or none."""
        ids = forward_ids[:len(frames)]
        if len(ids) < len(frames) or any(frame_instance(self.instances[i].frame) != frame_instance(f)
                                         for i, f in zip(ids, frames)):
            return ()
        return tuple(ids)

    def _function(self, frame: Frame) -> Function | None:
        file = frame.loc.file
        if file not in self._definitions:
            tree = parse_source(self.program.source_files.get(file))
            self._definitions[file] = _definitions(tree) if tree is not None else {}
        found = _find_function(self._definitions[file], frame.loc.line, frame.loc.function)
        if found is None:
            return None
        key = (frame.loc.file, found.lineno, found.col_offset)
        if key not in self._functions:
            self._functions[key] = Function(found, method=True)
        return self._functions[key]

    def _runs(self, inst: Instance) -> list[_Run]:
        nodes, level, fn = self.program.nodes, inst.level, inst.function
        executions = LineExecutions.of(self.program)
        runs: list[_Run] = []
        prev: tuple[Frame, ...] = ()
        for n in inst.nodes:
            f = nodes[n].frames[level]
            stmt = fn.statement(f.loc.line) if fn is not None else None
            key = stmt if stmt is not None else ("line", f.loc.line)
            ids = self.node_instances[n]
            child = ids[level + 1] if len(ids) > level + 1 else None
            run = runs[-1] if runs else None
            if run is None or run.key != key or executions.begins(prev, nodes[n], level):  # a loop's next iteration
                run = _Run(stmt, key, n, n)
                runs.append(run)
            run.last = n
            if child is not None and child not in run.children:
                run.children.append(child)
            prev = nodes[n].frames
        return runs

    # -- following a frame ---------------------------------------------------------------------------------------
    def _process(self, inst: Instance, arguments: dict[str, Binding]) -> None:
        fn = inst.function
        scope: dict[str, Binding] = {}

        def bind(name: str, value: Binding, after: int, line: int) -> None:
            scope[name] = value
            inst.events.append(Event(after, name, value, line))

        inst.arguments = dict(arguments)
        if fn is not None:
            for p in fn.params:
                if p.name in arguments:
                    bind(p.name, arguments[p.name], inst.first - 1, fn.node.lineno)
        done = -1  # the last statement with nodes
        for run in self._runs(inst):
            if fn is not None and run.stmt is not None:
                for k in fn.between(done, run.stmt):
                    self._execute(inst, fn.stmts[k], scope, bind, run.first - 1, None)
            stmt = fn.stmts[run.stmt] if fn is not None and run.stmt is not None else None
            for child_id in run.children:
                child = self.instances[child_id]
                call = self._call_for(child, stmt, run)
                if call is not None:
                    run.calls[id(call)] = child_id
                self._process(child, self._arguments(inst, child, call, scope, run))
            if stmt is not None:
                self._execute(inst, stmt, scope, bind, run.last, run)
                done = run.stmt
        if fn is not None:
            end = fn.return_after(done)
            if end is not None and end != done:
                for k in fn.between(done, end):
                    self._execute(inst, fn.stmts[k], scope, bind, inst.last, None)
                self._execute(inst, fn.stmts[end], scope, bind, inst.last, None)

    def _execute(self, inst: Instance, stmt: ast.stmt, scope: dict, bind, after: int, run: _Run | None) -> None:
        value_expr = _value_of(stmt)
        if value_expr is None or isinstance(stmt, ast.Expr):
            return
        spine = self._spine(inst, run) if run is not None else None
        identity = run is None or len(self.program.nodes[run.last].frames) > inst.level + 1
        calls = run.calls if run is not None else {}
        if isinstance(stmt, ast.AugAssign):
            value = spine
        else:
            value = self._eval(value_expr, scope, spine, calls, inst, identity)
        if isinstance(stmt, ast.Return):
            inst.returned = value
            return
        named: dict[str, str] = {}
        for target in _targets_of(stmt):
            self._assign(target, value, lambda name, v: bind(name, v, after, stmt.lineno))
            if run is not None:
                self._collect(target, value, named)
        if run is not None and named:
            frame = self.program.nodes[run.last].frames[inst.level]
            self.assignments.append(Assignment(run.last, frame_instance(frame), named))

    def _spine(self, inst: Instance, run: _Run) -> Binding:
        """What the outermost operation of a statement with nodes computed: its last node's outputs, or, when
        that node ran in a callee, what the callee returned."""
        last = self.program.nodes[run.last]
        if len(last.frames) > inst.level + 1 and run.children:
            returned = self.instances[run.children[-1]].returned
            if returned is not None:
                return returned
        return _outputs(last)

    def _assign(self, target: ast.expr, value: Binding, bind) -> None:
        if isinstance(target, ast.Name):
            bind(target.id, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            star = next((i for i, e in enumerate(elts) if isinstance(e, ast.Starred)), None)
            if isinstance(value, tuple) and star is None and len(value) == len(elts):
                for e, v in zip(elts, value):
                    self._assign(e, v, bind)
            elif isinstance(value, tuple) and star is not None and len(value) >= len(elts) - 1:
                tail = len(elts) - star - 1
                for e, v in zip(elts[:star], value[:star]):
                    self._assign(e, v, bind)
                self._assign(elts[star].value, tuple(value[star:len(value) - tail]), bind)
                for e, v in zip(elts[star + 1:], value[len(value) - tail:]):
                    self._assign(e, v, bind)
            else:
                for e in elts:
                    self._assign(e.value if isinstance(e, ast.Starred) else e, None, bind)
        elif isinstance(target, ast.Starred):
            self._assign(target.value, value, bind)
        # an attribute or an element of something (self.x = ..., cache[i] = ...) is not a variable

    def _collect(self, target: ast.expr, value: Binding, out: dict[str, str]) -> None:
        def bind(name: str, v: Binding) -> None:
            if isinstance(v, str):
                out[name] = v
        self._assign(target, value, bind)

    def _eval(self, e: ast.expr, scope: dict, spine: Binding, calls: dict[int, int], inst: Instance,
              identity: bool) -> Binding:
        """What an expression gives, followed by name; `spine` stands for the operation the statement's nodes
        computed, where the expression is one (off the spine, such an operation is not known)."""
        ev = lambda x, s=None: self._eval(x, scope, s, calls, inst, identity)  # noqa: E731
        if isinstance(e, ast.Name):
            return scope.get(e.id)
        if isinstance(e, ast.Constant):
            return None
        if isinstance(e, (ast.Tuple, ast.List)):
            out: list = []
            for x in e.elts:
                if isinstance(x, ast.Starred):
                    inner = ev(x.value)
                    if not isinstance(inner, tuple):
                        return None
                    out.extend(inner)
                else:
                    out.append(ev(x))
            return tuple(out)
        if isinstance(e, ast.Subscript):
            base = ev(e.value, spine)
            return _index(base, e.slice) if isinstance(base, (tuple, dict)) else spine
        if isinstance(e, ast.Attribute):
            if isinstance(e.value, ast.Name) and e.value.id == "self" and inst.frame.module_path is not None:
                path = f"{inst.frame.module_path}.{e.attr}" if inst.frame.module_path else e.attr
                if path in self._targets:
                    return self._targets[path]
            base = ev(e.value, spine)
            if isinstance(base, dict):
                return base.get(e.attr)
            if isinstance(base, tuple) and e.attr in ("values", "indices") and len(base) == 2:
                return base[0 if e.attr == "values" else 1]
            return spine
        if isinstance(e, ast.Call):
            if id(e) in calls:
                return self.instances[calls[id(e)]].returned
            func = e.func
            if isinstance(func, ast.Attribute) and func.attr in _IDENTITY_METHODS and identity:
                return ev(func.value, spine)
            if isinstance(func, ast.Attribute) and func.attr == "to_tuple" and not e.args:
                base = ev(func.value)
                if isinstance(base, dict):
                    return tuple(v for v in base.values() if v is not None)
            name = _terminal(func)
            if name in ("tuple", "list") and len(e.args) == 1 and not e.keywords:
                base = ev(e.args[0])
                if isinstance(base, tuple):
                    return base
            if (name and (name[:1].isupper() or name == "dict") and not e.args and e.keywords
                    and all(k.arg for k in e.keywords)):
                return {k.arg: ev(k.value) for k in e.keywords}  # a ModelOutput, a dict: fields by name
            return spine
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
            left, right = ev(e.left), ev(e.right)
            if isinstance(left, tuple) and isinstance(right, tuple):
                return left + right
        return spine

    # -- calls and parameters --------------------------------------------------------------------------------------
    def _call_for(self, child: Instance, stmt: ast.stmt | None, run: _Run) -> ast.Call | None:
        """The call in the caller's statement that made `child`."""
        if stmt is None:
            return None
        calls = [c for c in _calls(stmt) if id(c) not in run.calls]
        f = child.frame
        parts = (f.module_path or "").split(".")
        names = {f.loc.function} if f.loc.function != "forward" else set()
        if f.module_path:
            names.add(parts[-1])

        def matches(call: ast.Call) -> bool:
            func = call.func
            if isinstance(func, ast.Subscript) and len(parts) > 1 and parts[-1].isdigit():
                return _terminal(func.value) == parts[-2]  # self.layers[0](x)
            return _terminal(func) in names

        found = [c for c in calls if matches(c)]
        if found:
            return found[0]
        value = _value_of(stmt)
        while isinstance(value, (ast.Subscript, ast.Attribute)):  # outputs = self.model(x)[0]
            value = value.value
        return value if isinstance(value, ast.Call) and id(value) not in run.calls else None

    def _arguments(self, parent: Instance, child: Instance, call: ast.Call | None, scope: dict,
                   run: _Run) -> dict[str, Binding]:
        fn = child.function
        if fn is None:
            return {}
        out: dict[str, Binding] = {p.name: None for p in fn.params if p.kind != "variadic"}
        if call is not None:
            positional = [p for p in fn.params if p.kind == "positional"]
            for i, arg in enumerate(call.args):
                if isinstance(arg, ast.Starred) or i >= len(positional):
                    break
                out[positional[i].name] = self._eval(arg, scope, None, run.calls, parent, True)
            for kw in call.keywords:
                if kw.arg in out:
                    out[kw.arg] = self._eval(kw.value, scope, None, run.calls, parent, True)
        return self._flowing(child, out)

    def _root_arguments(self, inst: Instance) -> dict[str, Binding]:
        fn = inst.function
        if fn is None:
            return {}
        values = self.program.values
        out = {p.name: (p.name if p.name in values and values[p.name].kind == "input" else None)
               for p in fn.params if p.kind != "variadic"}
        return self._flowing(inst, out)

    def _flowing(self, inst: Instance, out: dict[str, Binding]) -> dict[str, Binding]:
        """A parameter the call does not tell, and without a default, is the one value that flows into the
        frame's first node from before it (not a parameter, buffer or constant of the model)."""
        fn = inst.function
        missing = [p.name for p in fn.params if p.kind != "variadic" and out.get(p.name) is None and not p.default]
        if len(missing) != 1:
            return out
        taken = set(flatten(out.values()))
        values = self.program.values
        first = self.program.nodes[inst.first]
        flowing = [v for v in first.input_names() if values[v].kind not in _NOT_FOLLOWED and v not in taken
                   and (values[v].producer is None or values[v].producer < inst.first)]
        if len(flowing) == 1:
            out[missing[0]] = flowing[0]
        return out

    # -- what a frame sees ---------------------------------------------------------------------------------------
    def instance(self, node: int, level: int) -> Instance | None:
        """The instance of the frame `level` of node `node` (0: the innermost, as the stack counts)."""
        ids = self.node_instances[node] if 0 <= node < len(self.node_instances) else ()
        return self.instances[ids[len(ids) - 1 - level]] if level < len(ids) else None

    def bindings(self, name: str) -> list[str]:
        """Every Program value a variable called `name` is bound to, in any frame instance, in the order the run
        binds them (its history across the run: `x` of every layer)."""
        events = [e for inst in self.instances for e in inst.events if e.name == name and isinstance(e.binding, str)]
        return list(dict.fromkeys(e.binding for e in sorted(events, key=lambda e: e.after)))

    def visible(self, inst: Instance, ran: Callable[[int], bool]) -> dict[str, Event]:
        """name -> the event that bound it last, of the events for which `ran(after)` is true (in order)."""
        out: dict[str, Event] = {}
        for event in inst.events:
            if not ran(event.after):
                break
            out[event.name] = event
        return out


def _outputs(node: Node) -> Binding:
    if len(node.outputs) == 1 and tuple(node.output_indices) == (0,):
        return node.outputs[0]
    out: list = [None] * (max(node.output_indices) + 1 if node.output_indices else 0)
    for name, i in zip(node.outputs, node.output_indices):
        out[i] = name
    return tuple(out)


def _index(base: tuple | dict, index: ast.expr) -> Binding:
    if isinstance(index, ast.Constant):
        key = index.value
        if isinstance(base, dict):
            if isinstance(key, str):
                return base.get(key)
            base = tuple(v for v in base.values() if v is not None)  # a ModelOutput indexed as its tuple
        if isinstance(key, int) and not isinstance(key, bool) and isinstance(base, tuple) \
                and -len(base) <= key < len(base):
            return base[key]
        return None
    if _negative(index):
        return _index(base, ast.Constant(-index.operand.value))
    if isinstance(index, ast.Slice) and isinstance(base, tuple):
        bounds = []
        for part in (index.lower, index.upper, index.step):
            if part is None:
                bounds.append(None)
            elif isinstance(part, ast.Constant) and isinstance(part.value, int):
                bounds.append(part.value)
            elif _negative(part) and isinstance(part.operand.value, int):
                bounds.append(-part.operand.value)
            else:
                return None
        return base[slice(*bounds)]
    return None


def _negative(e: ast.expr) -> bool:
    """-1 as written: a minus sign before a number."""
    return (isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) and isinstance(e.operand, ast.Constant)
            and isinstance(e.operand.value, (int, float)) and not isinstance(e.operand.value, bool))


def flatten(bindings: Iterable[Binding]) -> Iterable[str]:
    for b in bindings:
        if isinstance(b, str):
            yield b
        elif isinstance(b, tuple):
            yield from flatten(b)
        elif isinstance(b, dict):
            yield from flatten(b.values())


def source_scopes(program: Program) -> SourceScopes:
    """The SourceScopes of a Program (computed once per Program object, kept with it)."""
    scopes = program.__dict__.get("_source_scopes")
    if scopes is None:
        scopes = program.__dict__["_source_scopes"] = SourceScopes(program)
    return scopes


def assignments(program: Program) -> list[Assignment]:
    """Every statement with nodes that bound a name to a Program value, in execution order: the names it bound,
    at the last node of its run."""
    return source_scopes(program).assignments
