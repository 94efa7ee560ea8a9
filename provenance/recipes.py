"""Built-in fix recipes: each failure pattern's advice (provenance/patterns.py) as candidate patches.

A recipe turns one finding into a candidate fix, or says it does not apply. The repair loop
validates every candidate; a recipe only proposes. Recipes are tried in the order registered:

- a log of a softmax or a sigmoid (or 1 minus one) computed in one stable op (log_softmax,
  logsigmoid): before the log's clamp, which only hides the underflow;
- an op replaced by a stable form of itself (provenance/fix_functions.py), by pattern and op;
- for errors the reference does not share (precision caused them): the accumulation chain in
  float32, the node with what it is computed from and what reads it one step wider, and last the
  precision ablation's search for a small set of nodes that brings the outputs within tolerance.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from checkpoint.branch import FunctionPatch, PrecisionPatch
from hardware.program import Node, Program
from provenance import fix_functions
from provenance.ablation import search, wider_dtype
from provenance.fixes import Candidate, FunctionSource
from provenance.forensics import Finding, Forensics
from provenance.lineage import lineage

SEARCH_TRIALS = 16  # the precision search's trials, when a recipe runs it

# log of a chain (the log's argument's producer first, then its producer) -> the chain's first node's replacement
LOG_FORMS: list[tuple[tuple[str, ...], Callable]] = [
    (("aten.softmax",), fix_functions.log_softmax_for_softmax),
    (("aten._softmax",), fix_functions.log_softmax_for_softmax),
    (("aten.rsub", "aten.sigmoid"), fix_functions.log_sigmoid_of_negated),
    (("aten.sigmoid",), fix_functions.log_sigmoid),
]

# (pattern, op) -> the function that replaces the op
REPLACEMENTS: dict[tuple[str, str], Callable] = {
    ("exp-overflow", "aten.exp"): fix_functions.exp_minus_row_max,
    ("division-by-zero", "aten.rsqrt"): fix_functions.rsqrt_with_epsilon,
    ("division-by-zero", "aten.reciprocal"): fix_functions.reciprocal_with_epsilon,
    ("division-by-zero", "aten.div"): fix_functions.div_by_nonzero,
    ("outside-domain", "aten.log"): fix_functions.log_clamped,
    ("outside-domain", "aten.sqrt"): fix_functions.sqrt_clamped,
    ("outside-domain", "aten.rsqrt"): fix_functions.rsqrt_clamped,
    ("fully-masked-softmax-row", "aten.softmax"): fix_functions.softmax_zero_masked_rows,
    ("fully-masked-softmax-row", "aten._softmax"): fix_functions.softmax_zero_masked_rows,
}


@dataclass(frozen=True)
class Recipe:
    name: str
    make: Callable[[Finding, Forensics], Candidate | None]


RECIPES: list[Recipe] = []


def recipe(name: str):
    def register(make: Callable[[Finding, Forensics], Candidate | None]):
        RECIPES.append(Recipe(name, make))
        return make
    return register


def candidates(finding: Finding, forensics: Forensics):
    """The built-in candidates for a finding, in order (made lazily: the search runs trials)."""
    for r in RECIPES:
        made = r.make(finding, forensics)
        if made is not None:
            yield made


@recipe("the log computed in one stable op")
def _log_form(finding: Finding, forensics: Forensics) -> Candidate | None:
    """Before clamping a log's argument away from 0: when the argument is a softmax or a sigmoid (or 1 minus
    one) that nothing else reads, the whole chain is one op that cannot underflow: its first node computes the
    log form, the others (and the log) pass it on."""
    node, program = finding.node, forensics.program
    if not finding.match or finding.match.pattern.name != "outside-domain" or node.op_short != "aten.log":
        return None
    for ops, fn in LOG_FORMS:
        chain = _chain_above(program, node, ops)
        if chain is not None:
            fns = {n.index: fix_functions.log_already_taken for n in [node, *chain[:-1]]}
            fns[chain[-1].index] = fn
            return Candidate(f"{fn.__name__} in place of {', '.join(program.nodes[i].name for i in sorted(fns))}",
                             "built-in", [FunctionPatch(i, f, f"{f.__name__} (built-in)") for i, f in fns.items()],
                             {i: _built_in(f) for i, f in fns.items()},
                             f"{finding.match.pattern.title}: {fn.__doc__.splitlines()[0]}")
    return None


def _chain_above(program: Program, node: Node, ops: tuple[str, ...]) -> list[Node] | None:
    """The nodes producing `node`'s argument, its producer's, ... when their ops are `ops` and each is read by
    the next alone (else patching them would change other readers)."""
    chain = []
    for op in ops:
        names = node.input_names()
        producer = program.values[names[0]].producer if len(names) == 1 else None
        above = program.nodes[producer] if producer is not None else None
        if above is None or above.op_short != op or readers(program, names[0]) != [node.index]:
            return None
        if op == "aten.rsub" and not _one_minus(above):
            return None
        chain.append(above)
        node = above
    return chain


def _one_minus(node: Node) -> bool:
    """Is an rsub `1 - x` (its other operand 1, its alpha 1)?"""
    other = node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
    alpha = node.args[2] if len(node.args) > 2 else node.kwargs.get("alpha", 1)
    return other == 1 and alpha == 1


@recipe("stable replacement")
def _replacement(finding: Finding, forensics: Forensics) -> Candidate | None:
    fn = REPLACEMENTS.get((finding.match.pattern.name if finding.match else "", finding.node.op_short))
    if fn is None:
        return None
    node = finding.node
    return Candidate(f"{fn.__name__} in place of {node.name}", "built-in",
                     [FunctionPatch(node.index, fn, f"{fn.__name__} (built-in)")], {node.index: _built_in(fn)},
                     f"{finding.match.pattern.title}: {(fn.__doc__ or fn.__name__).splitlines()[0]}")


@recipe("accumulate in float32")
def _accumulate_wide(finding: Finding, forensics: Forensics) -> Candidate | None:
    if not finding.match or finding.match.pattern.name != "low-precision-accumulation":
        return None
    chain = accumulation_chain(forensics.program, finding.node)
    where = f"{Path(finding.node.loc.file).name}:{finding.node.loc.line}" if finding.node.loc else finding.node.name
    return _precision(f"the accumulation at {where} in float32",
                      [(n, "float32") for n in chain], "round the running total once, at the end")


@recipe("widen the computation")
def _widen_upstream(finding: Finding, forensics: Forensics) -> Candidate | None:
    """The node, what it is computed from and what reads it, one step wider: its readers too, since a result
    that needs the wider range (the rsqrt of a tiny variance) overflows again where it is read cast back."""
    if finding.reference_agrees:
        return None
    program = forensics.program
    value = finding.details.value
    nodes = sorted(set(lineage(program, value).nodes) | set(readers(program, value)))
    chosen = [(n, wider_dtype(forensics, n)) for n in map(program.nodes.__getitem__, nodes)
              if forensics.floating_outputs(n)]
    chosen = [(n, d) for n, d in chosen if d is not None]
    if not chosen:
        return None
    return _precision(f"{finding.node.name}, what it is computed from and what reads it, one step wider", chosen,
                      "the operands lose what the result needs in their own precision")


@recipe("precision search")
def _searched(finding: Finding, forensics: Forensics) -> Candidate | None:
    if finding.reference_agrees:
        return None
    found = search(forensics, max_trials=SEARCH_TRIALS).found
    if found is None:
        return None
    return _precision(f"{len(found.nodes)} node(s) found by precision ablation", list(zip(found.nodes, found.dtypes)),
                      "the smallest set of nodes whose higher precision brings the outputs within tolerance")


def _built_in(fn: Callable) -> FunctionSource:
    """Where a built-in replacement comes from (read by the integrity check and recorded as this text)."""
    return FunctionSource(inspect.getsourcefile(fix_functions), inspect.getsource(fix_functions), fn.__name__)


def readers(program: Program, value: str) -> list[int]:
    """The nodes that read `value`, in order."""
    return [n.index for n in program.nodes if value in n.input_names()]


def _precision(name: str, chosen: list[tuple[Node, str]], note: str) -> Candidate:
    return Candidate(name, "built-in", [PrecisionPatch(n.index, d) for n, d in chosen], {}, note)


def accumulation_chain(program: Program, node: Node) -> list[Node]:
    """The nodes of `node`'s op at its source line that feed one another through it, in order."""
    same = {n.index for n in program.nodes if n.op == node.op and n.loc == node.loc}
    chain = {node.index}
    grew = True
    while grew:
        grew = False
        for i in same - chain:
            feeds = {program.values[v].producer for v in program.nodes[i].input_names()}
            fed = any(program.values[v].producer == i for c in chain for v in program.nodes[c].input_names())
            if feeds & chain or fed:
                chain.add(i)
                grew = True
    return [program.nodes[i] for i in sorted(chain)]
