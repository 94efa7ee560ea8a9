"""expressions: `evaluate` escapes and cost bombs, on a stdio session stopped on entry of hostile.py build.

Escapes: dunders, imports (one writing a marker file, the marker module, torch.ops.import_module/load_library of
a library whose constructor writes a marker), open/exec/eval/compile, lambdas, comprehensions, f-strings, walrus,
starred, format strings; then seeded wrappings of the atoms in those forms. Bombs: huge powers, repetitions,
shifts, reshapes and expansions, 1000-level nesting, 2000-character expressions; `threads` is sent at once
beside each and must be answered while it runs. Odd: harmless oddities, answered either way.

Handled: the answer is a refusal with a message for an escape (any answer for the others), and `threads` is
answered afterwards (and, for a bomb, within 10 s while it runs). Code executed: a marker file or the marker
module appeared, or an escape was evaluated instead of refused. Crash, hang and leak as everywhere.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from .common import MARKER_MODULE, Family, Outcome, StdioSession, Wire, preview

TITLE = "expression escapes"
BUDGET_S = (90, 25)  # (default, --quick) seconds
CONTEXTS = ["repl", "watch", "hover", "clipboard", "variables"]


@dataclass
class Payload:
    text: str
    kind: str  # "escape" (must be refused), "bomb" (must be answered in time, threads meanwhile), "odd"


def escape_atoms(so: str | None) -> list[str]:
    """The escapes; {m} stands for the markers folder and {n} for a number that names the marker."""
    return [
        "__import__('os').system('touch {m}/A{n}')", "open('{m}/B{n}', 'w').write('x')",
        f"__import__('{MARKER_MODULE}')",
        "().__class__.__base__.__subclasses__()", "x.__class__.__init__.__globals__['__builtins__']",
        "torch.save(x, '{m}/C{n}')", "x.numpy().tofile('{m}/D{n}')", "exec(\"open('{m}/E{n}','w')\")",
        "eval(\"__import__('os').system('touch {m}/F{n}')\")", "compile('1', '{m}/G{n}', 'exec')",
        "getattr(getattr(x, '__class__'), '__mro__')", "x.__reduce_ex__(2)[0]", "breakpoint()",
        "globals()['__builtins__']", "type(x).__subclasses__()", "x.untyped_storage().from_file('{m}/H{n}', True, 8)",
        "torch.from_file('{m}/I{n}', True, 8)", "x.tolist().__class__.__base__.__subclasses__()",
        "[].__class__.__base__.__subclasses__()[0]", "x.__getattribute__('__class__')", "vars(x)", "dir(x)",
        "x.__dict__", "x.grad_fn", "x.data.__class__", "x.new_tensor([1])", "torch.ops.import_module('" + MARKER_MODULE
        + "')", "torch.ops.load_library('" + (so or "/nonexistent.so") + "')", "x.apply_(print)",
        "x.register_hook(print)", "x.storage()._write_file('{m}/J{n}')", "sys.modules", "os.system('touch {m}/K{n}')",
        "__builtins__", "x.T.__class__", "x.shape.__class__.__mro__", "x.dtype.__reduce__()", "help()", "input()",
        "memoryview(b'x')", "x.float().__array_interface__",
    ]


WRAPPERS = ["@", "(lambda: @)()", "[@ for _ in [1]]", 'f"{@}"', "(_y := @)", "[*(@,)]", "{**{'k': @}}",
            "x if @ else x", "x[@]", "max(1, @)", "@ and 1", "(1, @)[0]", "sum([@])", "not @", "x.reshape(@)",
            "{1: @}", "'%s' % (@,)", "[i for i in @]", "(y for y in [@])", "abs(@)"]
HANDWRITTEN = [
    "x.__class__", "x.__reduce__", "x.__reduce__()", "getattr(x, 'shape')", "getattr(x, '__class__')",
    "x.__class__.__bases__[0].__subclasses__()", "().__class__.__bases__[0].__subclasses__()",
    "''.__class__.__mro__[1].__subclasses__()", "x._base", "x._cdata", "__import__", "__builtins__.open",
    "lambda: 1", "(lambda x: x)(1)", "[c for c in 'ab']", "{c for c in 'ab'}", "{c: 1 for c in 'ab'}",
    "(c for c in 'ab')", 'f"{x}"', 'f"{x!r:>{10**9}}"', "(z := 5)", "[(z := x), z.__class__]",
    "[*x.__class__.__mro__]", "{**x.__dict__}", "'{0.__class__.__mro__}'.format(x)",
    "'{0.__init__.__globals__}'.format(x)", "'{:>1000000000}'.format(1)", "'%s' % x.__class__",
    "x.tolist.__self__", "x.sum.__self__.__class__", "(x).__class__", "x['__class__']", "x[...].__class__",
    "[x][0].__class__", "(1).__class__", "True.__class__", "None.__class__", "x.dtype.__class__", "x.shape._fields",
    "open", "exec", "eval", "compile", "globals", "locals", "vars", "dir", "type", "object", "super",
    "__loader__", "__spec__", "_", "__", "x.T.__init__", "x.mT.__new__", "x.real.__setattr__('a', 1)",
    "await x", "yield x", "x if True else __import__('os')", "print(1)", "float.fromhex('0x1p3')",
    "int.from_bytes(b'x', 'big')", "float('nan').__class__", "len.__self__", "max.__module__",
    "round.__call__(1.5)", "sum.__self__.open", "matmul.__globals__", "cosine.__globals__",
    "cosine.__code__", "softmax.__module__", "x.reshape.__self__", "x.flatten.__func__",
    "x.sum(dtype=__import__('torch').float64)", "x.sum(**{'dtype': 1})", "x.sum(*[0])",
    "x.to('meta')", "x.to(device='cuda:99')", "x.numpy()", "x.storage()", "x.untyped_storage()",
    "x\ud800",
]
REFUSED_NAMES = ("open", "exec", "eval", "compile", "globals", "locals", "vars", "dir", "type", "object", "super", "_",
                 "print(1)", "x._base", "x._cdata", "x.numpy()", "x.storage()", "x.untyped_storage()")
BOMBS = [
    "9**9**9", "3**(2**22)", "'a'*64*10**6", "2**10**10", "10**4300", "-(10**4299)", "1 << 10**9", "1 << (1 << 40)",
    "'%*d' % (10**9, 1)", "'%.*f' % (10**9, 1.0)", "[0]*10**8", "[[0]*65536]*65536", "'ab'*65536*65536",
    "[1]*(2**31)", "(1,)*10**9", "x.reshape(-1).expand(2**20, 8).sum()", "x.expand(2**16, 2**16, 2, 4).sum()",
    "x.flatten()[[0]*60000][:, None] * x.flatten()[[0]*60000]", "matmul(x.flatten()[[0]*30000][:, None], "
    "x.flatten()[[0]*30000][None, :])", "x.reshape(2**31, -1)", "x.reshape(10**12)", "x.reshape(-1, 2**63)",
    "softmax(x, 10**12)", "topk(x.flatten(), 10**12)", "round(1.5, 10**9)", "round(1.5, -10**9)",
    "x.view(-1)[10**12]",
    "x.permute(*range(10**6))", "x.sum(10**18)", "x.flatten()[::2**62]", "float(10**5000)", "int('9'*5000)",
    "int(1e308) ** 2", "x ** (10**12)", "x.cumsum(0).cumsum(1).cumsum(0).cumsum(1)",
    "(" * 999 + "1" + ")" * 999, "-" * 1999 + "1", "not " * 499 + "1", "[" * 999 + "]" * 999,
    "x" + "[0]" * 600, "x" + ".t()" * 400, "1+" * 999 + "1", "x" + "*x" * 600, "x" + "@x.T" * 300,
    "x.flatten()" + "[None]" * 300, "((x" + "+x" * 200 + ")" + ".sum()", "[" + "x," * 999 + "]",
    "max(" * 199 + "1" + ",1)" * 199, "x" + ".reshape(8)" * 100 + ".sum()",
    "x.reshape(1,8).expand(2**13,8).T @ x.reshape(1,8).expand(2**13,8)",
    "matmul(x.reshape(8,1).expand(8, 2**24), x.reshape(1,8).expand(2**24, 8))",
    "(x.flatten()[[0]*4096][:, None] * x.flatten()[[1]*4096]).sum() + " * 20 + "0",
    "x" * 2001, "1" * 1990, "'" + "a" * 64 + "'" + " * 2**30",
]


def handwritten_kind(text: str) -> str:
    escapes = ("__" in text or "lambda" in text or " for " in text or "f\"" in text or ":=" in text
               or "import" in text or text in REFUSED_NAMES)
    return "escape" if escapes else "odd"


def expression_payloads(rng: random.Random, markers: Path, so: str | None, count: int) -> list[Payload]:
    """The atoms, the handwritten ones and the bombs, then seeded wrappings of atoms up to `count` in all."""
    m = str(markers)
    atoms = escape_atoms(so)
    out = [Payload(atom.replace("{m}", m).replace("{n}", str(n)), "escape") for n, atom in enumerate(atoms, 1)]
    out += [Payload(text, handwritten_kind(text)) for text in HANDWRITTEN]
    out += [Payload(text, "bomb") for text in BOMBS]
    generated = [(atom, wrapper) for atom in atoms for wrapper in WRAPPERS]
    rng.shuffle(generated)
    for n, (atom, wrapper) in enumerate(generated, len(atoms) + 1):
        if len(out) >= count:
            break
        out.append(Payload(wrapper.replace("@", atom.replace("{m}", m).replace("{n}", str(n))), "escape"))
    return out


def chosen_payloads(fam: Family) -> list[Payload]:
    payloads = expression_payloads(fam.rng, fam.ctx.markers, fam.ctx.marker_so, fam.n(260, 70))
    if fam.ctx.quick:
        bombs = [p for p in payloads if p.kind == "bomb"]
        payloads = fam.rng.sample([p for p in payloads if p.kind != "bomb"], 28) + fam.rng.sample(bombs, 12)
    return payloads


def run(fam: Family) -> None:
    payloads = chosen_payloads(fam)
    session = StdioSession(fam, "setup", "initialize, launch hostile.py build stopOnEntry", launched=True)
    if not session.renew("stopped on entry"):
        return
    for i, payload in enumerate(payloads):
        if fam.out_of_time():
            continue
        if evaluate(fam, session.wire, i, payload).broke and not session.renew("stopped on entry"):
            return
    session.close()


def evaluate(fam: Family, wire: Wire, i: int, payload: Payload) -> Outcome:
    context = CONTEXTS[i % len(CONTEXTS)] if payload.kind != "bomb" else "repl"
    arguments = {"expression": payload.text, "context": context, "frameId": 1}
    repro = (f"stdio server, hostile.py build stopped on entry: evaluate {preview(arguments, 500)}"
             + ("; threads sent at once, must be answered while it runs" if payload.kind == "bomb" else ""))
    with fam.check(f"{payload.kind} #{i}: {payload.text[:60]}", repro) as chk:
        started = time.monotonic()
        seq = chk.send(wire, "evaluate", arguments)
        if payload.kind == "bomb":
            threads_seq = chk.send(wire, "threads")
            answer = chk.wait(wire, threads_seq, 10.0, "threads while a bomb is evaluated")
            chk.expect(bool(answer.get("success")), "threads refused while a bomb was evaluated")
        response = chk.wait(wire, seq, what="evaluate")
        took = time.monotonic() - started
        if payload.kind == "escape" and response.get("success"):
            chk.outcome.executed.append(f"evaluated instead of refused: {preview(response.get('body'), 200)}")
        if payload.kind == "bomb" and took > 10:
            fam.notes.append(f"bomb #{i} {payload.text[:60]!r} took {took:.1f} s to answer")
        chk.threads(wire)
    return chk.outcome
