"""Inside the candidate: which of its lines first departs from what the reference implies.

Three ways, by what the two sides share:
- `by_names`: both are Programs of the user's code with the same variables (a refactor, a port): a value is
  matched by the frame, module path and variable name that hold it (then, for values no variable holds, by module
  path, op and occurrence); the first candidate value beyond tolerance of the reference's is the line;
- `by_prefix`: the candidate is a blocked loop over an input (online softmax over blocks of keys): after each
  iteration, what it carries must be the reference's answer on the prefix it has read. The lines after the loop
  are run again by the engine on each iteration's carried values and compared with the reference called on that
  prefix; in the first iteration that departs, the carried value that alone could make it right (solved for) is
  the one whose line is wrong; a prefix that never reaches the end of an input is a dropped tail;
- `by_dependence`: otherwise, which input elements each output element depends on: one slice of an input is
  perturbed, both sides run again, and the first candidate value whose change spreads beyond the perturbed slice
  where the reference's outputs do not (a reduction over the wrong axis) is the line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from hardware.program import Program
from hardware.source_names import assignments
from provenance.candidates.loops import Loop, find_loop
from provenance.candidates.passes import Pass, judge, truth

Export = Callable[[tuple], Program]  # a side's Program over other arguments


@dataclass
class Departure:
    line: int | None
    file: str
    value: str  # the candidate's value (its variable's name where it has one)
    how: str  # names, prefix, tail, dependence
    evidence: list[str] = field(default_factory=list)
    iteration: int | None = None

    def to_dict(self) -> dict:
        return {"line": self.line, "file": self.file, "value": self.value, "how": self.how,
                "evidence": self.evidence, "iteration": self.iteration}


def where_wrong(wrong: torch.Tensor) -> dict:
    """The wrong elements of an output in words: which rows (and columns), a mask of where."""
    count, total = int(wrong.sum()), wrong.numel()
    out = {"count": count, "of": total}
    if wrong.dim() >= 2:
        rows = wrong.reshape(wrong.shape[0], -1)
        cols = wrong.reshape(-1, wrong.shape[-1])
        out["rows"] = [int(i) for i in rows.any(1).nonzero().reshape(-1)]
        out["columns"] = [int(i) for i in cols.any(0).nonzero().reshape(-1)]
        out["wholeRows"] = bool((rows.any(1) == rows.all(1)).all())
        out["rowsOf"] = wrong.shape[0]
    return out


def spans(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0..2, 5'."""
    parts, i = [], 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        parts.append(str(indices[i]) if i == j else f"{indices[i]}..{indices[j]}")
        i = j + 1
    return ", ".join(parts[:8]) + (", …" if len(parts) > 8 else "")


def line_of(program: Program, value: str) -> tuple[str, int | None]:
    info = program.values[value]
    node = program.nodes[info.producer] if info.producer is not None else None
    return (node.loc.file, node.loc.line) if node is not None and node.loc else ("", None)


# -- by names ----------------------------------------------------------------------------------------------------
def by_names(candidate: Pass, reference: Program, exact: Callable[[str], torch.Tensor]) -> Departure | None:
    """The first candidate value, in execution order, that departs from the reference's value of the same meaning."""
    mine, theirs = _meanings(candidate.program), _meanings(reference)
    for key, value in mine.items():
        other = theirs.get(key)
        if other is None or candidate.program.values[value].shape != reference.values[other].shape:
            continue
        if not candidate.program.values[value].dtype.startswith(("float", "bfloat")):
            continue
        judged = judge(value, candidate.value(value), exact(other))
        if judged.comparison.within:
            continue
        file, line = line_of(candidate.program, value)
        what = key[2] if key[0] == "name" else f"the {key[2]} in module '{key[1]}'" if key[1] else f"the {key[2]}"
        where = where_wrong(judged.wrong)
        return Departure(line, file, what, "names", [
            f"{_quoted(what)} has {where['count']} of {where['of']} elements beyond tolerance of the reference's "
            f"{what.removeprefix('the ')} (error {judged.comparison.error:.3g} x tolerance); every value before it "
            "agrees"])
    return None


def _quoted(what: str) -> str:
    return what if what.startswith("the ") else f"'{what}'"


def _meanings(program: Program) -> dict[tuple, str]:
    """What each value means to the user, in execution order: (name, frame's module path, variable, occurrence),
    else (op, module path, op, occurrence) for a value no variable holds."""
    out: dict[tuple, tuple[int, str]] = {}
    seen: dict[tuple, int] = {}
    named = set()
    for a in assignments(program):
        for name, value in a.names.items():
            base = ("name", a.frame[2] or "", name)
            k = seen[base] = seen.get(base, -1) + 1
            out[base + (k,)] = (program.values[value].producer or 0, value)
            named.add(value)
    for node in program.nodes:
        for value in node.outputs:
            if value in named:
                continue
            base = ("op", node.module_path, node.op_short)
            k = seen[base] = seen.get(base, -1) + 1
            out[base + (k,)] = (node.index, value)
    return {key: value for key, (_, value) in sorted(out.items(), key=lambda kv: kv[1][0])}


# -- by prefix ---------------------------------------------------------------------------------------------------
def by_prefix(candidate: Pass, export_reference: Export, args: tuple, wrong: torch.Tensor,
              slack: float) -> Departure | None:
    """The blocked loop's first iteration whose carried values depart from the reference on the prefix read."""
    program = candidate.program
    loop = find_loop(program)
    if loop is None or len(program.outputs) != 1:
        return None
    gap = _gap(candidate, loop)
    if gap is not None:
        return gap
    carried = _carried(program, loop)
    if carried is None:
        return None
    inputs = [n for n, v in program.values.items() if v.kind == "input"]
    covered = loop.covered(program)
    for j in range(len(loop.starts)):
        prefix = list(args)
        for (name, dim), ends in covered.items():
            prefix[inputs.index(name)] = args[inputs.index(name)].narrow(dim, 0, ends[j])
        reference = export_reference(tuple(prefix))
        implied = truth(reference).value(reference.outputs[0])
        given = {value: candidate.value(loop.names[j][name]) for value, name in carried.items()}
        partial = candidate.rerun(loop.end, given)[program.outputs[0]]
        judged = judge("partial", partial, implied, slack)
        if not judged.comparison.within:
            return _departing_iteration(candidate, loop, carried, j, given, implied, judged, wrong, covered, slack)
    return _dropped_tail(candidate, loop, covered)


def _gap(candidate: Pass, loop: Loop) -> Departure | None:
    """The first block read that does not start where the previous one of the same input ended (a gap or an
    overlap: an off-by-one in a block index), named at its slicing line."""
    program = candidate.program
    reached: dict[tuple[str, int], int] = {}
    for j, reads in enumerate(loop.reads):
        for r in reads:
            key = (r.input, r.dim)
            expected = reached.get(key, 0)
            if r.start != expected and not (r.start == r.end == program.values[r.input].shape[r.dim]):
                file, line = line_of(program, program.nodes[r.node].outputs[0])
                what = "skips" if r.start > expected else "reads again"
                span = f"[{min(r.start, expected)}:{max(r.start, expected)}]"
                return Departure(line, file, f"{candidate.label(r.input)}[{r.start}:{r.end}]", "gap", [
                    f"iteration {j} reads '{candidate.label(r.input)}'[{r.start}:{r.end}] along dim {r.dim} where the "
                    f"blocks before it ended at {expected}: it {what} '{candidate.label(r.input)}'{span} (an "
                    "off-by-one in a block index)"], j)
            reached[key] = max(expected, r.end)
    return None


def _carried(program: Program, loop: Loop) -> dict[str, str] | None:
    """The epilogue's inputs written in the loop -> the variable that holds them (None if one has no name)."""
    last = loop.names[-1]
    by_value = {v: n for n, v in last.items()}
    out = {}
    for node in program.nodes[loop.end:]:
        for name in node.input_names():
            producer = program.values[name].producer
            if producer is not None and loop.iteration_of(producer) is not None:
                if name not in by_value:
                    return None
                out[name] = by_value[name]
    if not out or any(n not in names for names in loop.names for n in out.values()):
        return None
    return out


def _departing_iteration(candidate: Pass, loop: Loop, carried: dict[str, str], j: int, given: dict, implied,
                         judged, wrong: torch.Tensor, covered: dict, slack: float) -> Departure:
    program = candidate.program
    dtype = candidate.value(program.outputs[0]).dtype
    fixable = [name for value, name in carried.items()
               if _can_fix(candidate, loop.end, given, value, implied, dtype, slack)]
    culprit = fixable[0] if len(fixable) == 1 else None
    name = culprit or ", ".join(carried.values())
    reads = "; ".join(f"'{candidate.label(i)}'[{0 if j == 0 else ends[j - 1]}:{ends[j]}] along dim {d}"
                      for (i, d), ends in covered.items())
    evidence = [f"after iteration {j} (reading {reads}) the result of the lines after the loop departs from "
                f"the reference on the prefix read (error {judged.comparison.error:.3g} x tolerance); every earlier "
                "iteration agrees"]
    if culprit:
        others = [n for n in carried.values() if n != culprit]
        evidence.append(f"'{culprit}' is the value that would have to change: with it alone solved for, the prefix "
                        f"agrees with the reference" + (f"; no value of {', '.join(repr(o) for o in others)} alone "
                                                        "makes it agree" if others else ""))
    else:
        evidence.append("no single carried value alone makes the prefix agree" if not fixable else
                        f"each of {', '.join(fixable)} alone could make it agree")
    evidence += _rows_explained(candidate, loop, wrong)
    line = loop.lines.get(culprit) if culprit else loop.line
    return Departure(line, loop.file, name, "prefix", evidence, j)


def _can_fix(candidate: Pass, start: int, given: dict, value: str, implied: torch.Tensor, dtype: torch.dtype,
             slack: float) -> bool:
    """Is there a value of `value` alone (the others as given) for which the lines from `start` on compute
    `implied`? Solved by least squares through those lines."""
    program = candidate.program
    x = given[value].detach().double().clone().requires_grad_(True)
    fixed = {k: v.detach().double() for k, v in given.items() if k != value}
    target = implied.detach().double()
    finite = torch.isfinite(target)

    def forward() -> torch.Tensor:
        env = {**fixed, value: x}
        for node in program.nodes[start:]:
            args, kwargs = node.bind(lambda n: env[n] if n in env else candidate.value(n).double()
                                     if candidate.value(n).is_floating_point() else candidate.value(n))
            result = node.target(*args, **kwargs)
            for name, out in zip(node.outputs, result if isinstance(result, (tuple, list)) else [result]):
                env[name] = out
        return env[program.outputs[0]]

    optimizer = torch.optim.LBFGS([x], max_iter=200, tolerance_grad=1e-14, tolerance_change=1e-16,
                                  line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = ((forward() - target)[finite] ** 2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        for _ in range(3):
            optimizer.step(closure)
    with torch.no_grad():
        return judge("solved", forward().to(dtype), implied, slack).comparison.within


def _rows_explained(candidate: Pass, loop: Loop, wrong: torch.Tensor) -> list[str]:
    """A variable of the loop that changes after the first iteration in exactly the wrong rows."""
    if wrong.dim() < 2 or not wrong.any() or len(loop.names) < 2:
        return []
    rows = wrong.reshape(wrong.shape[0], -1).any(1)
    for name in loop.names[0]:
        held = [candidate.value(names[name]) for names in loop.names if name in names]
        if len(held) != len(loop.names) or held[0].dim() == 0 or held[0].shape[0] != rows.numel():
            continue
        changed = torch.zeros_like(rows)
        for before, after in zip(held, held[1:]):
            changed |= (after != before).reshape(rows.numel(), -1).any(1)
        if torch.equal(changed, rows):
            return [f"the {int(rows.sum())} wrong rows of {rows.numel()} are exactly the rows where '{name}' "
                    f"(line {loop.lines.get(name)}) changes after the first iteration: those whose '{name}' grows "
                    "past the first block; the rows where it is set by the first block are right"]
    return []


def _dropped_tail(candidate: Pass, loop: Loop, covered: dict) -> Departure | None:
    program = candidate.program
    short = [(name, dim, ends[-1], program.values[name].shape[dim]) for (name, dim), ends in covered.items()
             if ends[-1] < program.values[name].shape[dim]]
    if not short:
        return None
    unread = "; ".join(f"'{candidate.label(n)}'[{end}:{size}] along dim {d}" for n, d, end, size in short)
    return Departure(loop.line, loop.file, "", "tail", [
        f"the loop stops before the end of its input: {unread} is read by no line (the tail block, shorter than a "
        "block, is dropped)",
        "every iteration's result agrees with the reference on the prefix it read"])


# -- by dependence -----------------------------------------------------------------------------------------------
def by_dependence(candidate: Pass, reference: Program, export_candidate: Export, export_reference: Export,
                  args: tuple) -> Departure | None:
    """The first candidate value whose change spreads beyond a perturbed slice of an input where the reference's
    outputs stay confined to it."""
    program = candidate.program
    inputs = [n for n, v in program.values.items() if v.kind == "input"]
    base_ref = truth(reference)
    base = {n: candidate.value(n) for node in program.nodes for n in node.outputs}
    for k, name in enumerate(inputs):
        x = args[k]
        if not x.is_floating_point():
            continue
        for dim in range(x.dim()):
            index = x.shape[dim] - 1
            moved = list(args)
            moved[k] = x.clone()
            moved[k].select(dim, index).add_(0.5 * (float(x.double().square().mean().sqrt()) + 1e-3))
            ref_changed = [(truth(reference.with_inputs(dict(zip(_inputs(reference), moved)))).value(o)
                            != base_ref.value(o)) for o in reference.outputs]
            again = Pass(program.with_inputs(dict(zip(inputs, moved))), candidate.driver.name)
            spread = _first_spread(program, again, base, x.shape[dim], index)
            cand_changed = [again.value(o) != base[o] for o in program.outputs]
            leaks = any(bool((c & ~r).any()) for c, r in zip(cand_changed, ref_changed) if c.shape == r.shape)
            if leaks and spread is not None:
                file, line = line_of(program, spread)
                return Departure(line, file, name_of(program, spread), "dependence", [
                    f"changing '{candidate.label(name)}' at index {index} along dim {dim} changes only the "
                    f"matching slice of the reference's output, but the candidate's '{name_of(program, spread)}' "
                    "changes beyond that slice: it mixes what the reference keeps apart (a reduction over the "
                    "wrong axis?)"])
    return None


def _inputs(program: Program) -> list[str]:
    return [n for n, v in program.values.items() if v.kind == "input"]


def _first_spread(program: Program, again: Pass, base: dict, size: int, index: int) -> str | None:
    for node in program.nodes:
        for name in node.outputs:
            after = again.value(name)
            if not after.is_floating_point() or after.shape != base[name].shape:
                continue
            changed = after != base[name]
            if changed.any() and not _confined(changed, size, index):
                return name
    return None


def _confined(changed: torch.Tensor, size: int, index: int) -> bool:
    for dim, extent in enumerate(changed.shape):
        if extent == size and not changed.movedim(dim, 0)[torch.arange(size) != index].any():
            return True
    return False


def name_of(program: Program, value: str) -> str:
    for a in assignments(program):
        for name, bound in a.names.items():
            if bound == value:
                return name
    return value
