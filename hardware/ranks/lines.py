"""Where a line breakpoint binds when ranks run different code (docs/ranks.md, "Through DAP"): a pipeline's stage
sends on a line where the last stage runs nothing.

Each rank binds a line breakpoint as a single Session does (hardware/session/breakpoints.py's resolve_line): at its
line when a node of the rank runs there, else at the next line of the same function where one does. Over the ranks
the breakpoint's line is the earliest any rank bound it to: the asked line when a node runs there on some rank, else
the next line of the function where a node runs on any rank, where a single session over every rank's lines would
move it. A rank that bound it further on runs no node at that line: it keeps no such breakpoint, else it would stop
at another line than the one the client was told.
"""

from __future__ import annotations

from typing import Callable, Sequence

Answers = dict[int, list[dict]]  # each rank's answer to a file's line breakpoints: one per breakpoint, in order


def bound_where_run(answers: Answers, ask_again: Callable[[dict[int, list[int]]], Answers]) -> Answers:
    """Every rank's `answers`, with the breakpoints a rank bound past their line over the ranks dropped: the ranks
    that drop some are asked again (`ask_again`: by rank, the places in the asked list of the breakpoints it keeps;
    their answers, in that order), and answer each dropped one unbound."""
    lines = [min((bp["line"] for bp in on_ranks if bp["verified"]), default=None)
             for on_ranks in zip(*(answers[r] for r in sorted(answers)))]
    keep = {r: [i for i, bp in enumerate(answer) if not bp["verified"] or bp["line"] == lines[i]]
            for r, answer in answers.items()}
    keep = {r: places for r, places in keep.items() if len(places) < len(answers[r])}
    again = ask_again(keep) if keep else {}
    out = dict(answers)
    for r, places in keep.items():
        kept = dict(zip(places, again[r]))
        out[r] = [kept.get(i) or _unbound(lines[i]) for i in range(len(answers[r]))]
    return out


def _unbound(line: int) -> dict:
    return {"id": None, "verified": False, "line": line, "message": f"no node of this rank runs at line {line}"}


def only_on(on_ranks: Sequence[dict]) -> str | None:
    """What a breakpoint bound on some ranks only says of the others (each rank's answer, by rank); None: bound on
    every rank, or on none."""
    bound = [r for r, bp in enumerate(on_ranks) if bp["verified"]]
    if not bound or len(bound) == len(on_ranks):
        return None
    rest = "; ".join(f"rank {r}: {bp.get('message')}" for r, bp in enumerate(on_ranks) if not bp["verified"])
    return f"on rank{'s' if len(bound) > 1 else ''} {', '.join(map(str, bound))} only; {rest}"
