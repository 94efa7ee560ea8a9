"""Built-in fix recipes: each failure pattern's advice (provenance/patterns.py) as candidate patches.

A recipe turns one finding into a candidate fix, or says it does not apply. The repair loop
validates every candidate; a recipe only proposes. Recipes are tried in the order registered:

- a log of a softmax or a sigmoid (or 1 minus one) computed in one stable op (log_softmax,
  logsigmoid): before the log's clamp, which only hides the underflow;
- an op replaced by a stable form of itself (provenance/fix_functions.py), by pattern and op;
- for errors the reference does not share (precision caused them): the accumulation chain in
  float32, the node with what it is computed from and what reads it one step wider, and last the
  precision ablation's search for a small set of nodes that brings the outputs within tolerance.

A training step's failures (provenance/training_patterns.py): a NaN gradient through a `where` is fixed in the
backward node (patches of the forward node do not change the exported backward, which reads the op's input: the
log's gradient divides by x whatever the forward computes), a root's infinite gradient at 0 in the forward node (its
backward reads the root); gradients flushed to zero by loss scaling and exploding ones by clipping, both edits of the
Program (provenance/program_edits.py); an optimizer epsilon the dtype cannot hold by one it can, else by the update in
float32. The knowledge base applies each patch in every step (Candidate.in_every_step).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import math

import torch

from checkpoint.branch import AttributePatch, FunctionPatch, PrecisionPatch
from hardware.optimizer_ops import ADAM_UPDATE, adam_argument
from hardware.program import Node, Program
from provenance import fix_functions
from provenance.ablation import search, wider_dtype
from provenance.fixes import Candidate, FunctionSource
from provenance.forensics import Finding, Forensics
from provenance.lineage import lineage
from provenance.program_edits import ProgramEdit

SEARCH_TRIALS = 16  # the precision search's trials, when a recipe runs it
CLIP_NORM = 1.0  # the gradients' total norm clipping keeps them to (a common choice; the update's size follows)
# Loss scaling leaves the backward's largest value this many times below the dtype's largest number: room for
# other inputs' gradients (an input set scaled up), as a fixed scale has no back-off.
LOSS_SCALE_HEADROOM = 16.0

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
    # a training step's: the backward node itself, or (by the forward op) the forward node it differentiates
    ("nan-gradient-through-where", "aten.div"): fix_functions.div_where_gradient_is_zero,
    ("sqrt-at-zero-gradient", "aten.sqrt"): fix_functions.sqrt_with_epsilon,
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
    """The node replaced by a stable form of its op; for a backward node whose own op has none, the forward node
    it differentiates (a root's backward reads the root: a root that is never 0 has a finite gradient)."""
    pattern = finding.match.pattern.name if finding.match else ""
    forward = forensics.program.forward_node(finding.node)
    node = next((n for n in (finding.node, forward) if n is not None and (pattern, n.op_short) in REPLACEMENTS), None)
    if node is None:
        return None
    fn = REPLACEMENTS[(pattern, node.op_short)]
    return Candidate(f"{fn.__name__} in place of {node.name}", "built-in",
                     [FunctionPatch(node.index, fn, f"{fn.__name__} (built-in)")], {node.index: _built_in(fn)},
                     f"{finding.match.pattern.title}: {(fn.__doc__ or fn.__name__).splitlines()[0]}")


@recipe("loss scaling")
def _loss_scaling(finding: Finding, forensics: Forensics) -> Candidate | None:
    if not finding.match or finding.match.pattern.name != "gradient-underflow":
        return None
    edit = ProgramEdit.of("loss-scaling", {"scale": loss_scale(forensics, finding)})
    return Candidate(f"loss scaling by {dict(edit.settings)['scale']:g}", "built-in", [],
                     note=f"{finding.match.pattern.title}: {edit.describe()}", edit=edit)


def loss_scale(forensics: Forensics, finding: Finding) -> float:
    """The largest power of two that keeps the finding's step's backward LOSS_SCALE_HEADROOM times below the
    largest number of the finding's dtype (read from the write log's statistics: no value is copied)."""
    tl, program = forensics.timeline, forensics.program
    largest = max((max(abs(r.stats.min), abs(r.stats.max)) for n in program.nodes
                   if n.phase == "backward" and n.step == finding.node.step
                   for r in tl.log.at_tick(tl.node_tick[n.index]) if r.stats.finite), default=1.0)
    room = torch.finfo(getattr(torch, program.values[finding.details.value].dtype)).max / LOSS_SCALE_HEADROOM
    return float(2.0 ** max(0, math.floor(math.log2(room / max(largest, 1e-30)))))


@recipe("clip the gradients")
def _clipping(finding: Finding, forensics: Forensics) -> Candidate | None:
    if not finding.match or finding.match.pattern.name != "exploding-gradients":
        return None
    edit = ProgramEdit.of("gradient-clipping", {"maxNorm": CLIP_NORM})
    return Candidate(f"the gradients clipped to norm {CLIP_NORM:g}", "built-in", [],
                     note=f"{finding.match.pattern.title}: {edit.describe()}", edit=edit)


@recipe("the update in float32")
def _update_in_float32(finding: Finding, forensics: Forensics) -> Candidate | None:
    """Every optimizer node of a low-precision update run in float32: its state and the parameters it writes kept
    in float32 between the steps' updates (a float32 master copy), the forward reading them cast back."""
    if not finding.match or finding.match.pattern.name != "adam-epsilon-underflow":
        return None
    values = forensics.program.values
    chosen = [(n, "float32") for n in forensics.program.nodes if n.phase == "optimizer"  # its step count aside
              and any(values[o].dtype in ("float16", "bfloat16") for o in forensics.floating_outputs(n))]
    return _precision("the optimizer's update in float32", chosen, "the optimizer's state in float32")


@recipe("an epsilon the dtype holds")
def _representable_epsilon(finding: Finding, forensics: Forensics) -> Candidate | None:
    """Every optimizer node adding the same epsilon, with the smallest power of ten the dtype holds as a normal
    number (1e-4 in float16)."""
    if not finding.match or finding.match.pattern.name != "adam-epsilon-underflow":
        return None
    program = forensics.program
    eps = adam_argument(finding.node, "eps")
    dtype = getattr(torch, program.values[finding.node.outputs[2]].dtype)  # the second moment's
    held = 10.0 ** math.ceil(math.log10(torch.finfo(dtype).tiny))
    nodes = [n for n in program.nodes if n.op == ADAM_UPDATE and adam_argument(n, "eps") == eps]
    return Candidate(f"the optimizer's eps {eps:g} -> {held:g}", "built-in",
                     [AttributePatch.of(n, {"eps": held}) for n in nodes], {},
                     f"{finding.match.pattern.title}: {held:g} is the smallest power of ten {dtype} holds as a normal "
                     "number (set eps where the optimizer is made)")


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
