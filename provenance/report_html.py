"""The forensics report as HTML: one self-contained file to send (`rewind forensics model.py --html report.html`),
and the same sections inline in a notebook (rewind/'s displays).

The page needs no network: its pictures are data: URIs (provenance/charts.py), its style and its few lines of
script (the per-node table sorts by any column) are inline. It shows the verdict, the root cause with the source
around its line, the error-growth chart (every node's worst error against the reference, in units of tolerance,
with the origin, the amplifiers, the divergence and NaN/Inf births marked), the fix with its evidence (the origin
confirmed by ablation, the precision ablation that brings the outputs back within tolerance), the per-node table
and the whole report in words. Everything the report quotes (source lines, names) is escaped: a model's text
never becomes markup. The file is written as every file Rewind writes: whole or not at all, and an existing one
only replaced when asked (checkpoint/safe_files.py).
"""

from __future__ import annotations

import linecache
import math
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Mapping

from checkpoint.safe_files import atomic_write
from hardware.program import Node
from provenance.ablation import Search
from provenance.charts import Mark, data_uri, errors_png
from provenance.forensics import Finding, WithForensics
from provenance.investigation import Investigation, render
from provenance.origins import Origin, op_name, where, worst
from provenance.patterns import Match, times

CONTEXT_LINES = 3  # source lines shown above and below the root cause's
MAX_TABLE_ROWS = 5000  # rows of the per-node table in the page (the chart has every node)


@dataclass
class ForensicsEvidence:
    """What a report shows: the investigation, every node's error against the reference, the source files."""

    investigation: Investigation
    rows: list[dict]  # Forensics.table(introduced=True): one row per floating output of each node
    sources: Mapping[str, str]  # file -> text


def gather(session: WithForensics, found: Investigation) -> ForensicsEvidence:
    """The evidence of an investigation of `session`'s pass (the per-node table is measured here)."""
    return ForensicsEvidence(found, session.forensics.table(introduced=True), session.program.source_files)


def page(evidence: ForensicsEvidence) -> str:
    """The whole document: style, sections and the table's sorting, with nothing to fetch."""
    inv = evidence.investigation
    verdict = "problem" if inv.problem else "clean"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>Rewind forensics: {escape(_name(inv))}</title><style>{PAGE_STYLE}{STYLE}</style></head>"
            f'<body data-verdict="{verdict}"><div class="rewind-report">{sections(evidence)}</div>'
            f"<script>{SCRIPT}</script></body></html>\n")


def sections(evidence: ForensicsEvidence) -> str:
    """The report's sections: the page's body, and a notebook's display in `styled` (where the table does not sort:
    a notebook runs no script of an output)."""
    inv = evidence.investigation
    parts = [_header(inv), _root_cause(inv, evidence.sources), _chart(evidence), _fix(inv), _ablation(inv.ablation),
             _table(evidence.rows),
             f"<details><summary>The report in words</summary><pre>{escape(render(inv, evidence.sources))}"
             "</pre></details>"]
    return "".join(parts)


def styled(body: str) -> str:
    """Markup shown inside another page (a notebook's output): in the report's <div>, with its scoped style."""
    return f'<style>{STYLE}</style><div class="rewind-report">{body}</div>'


def write(path: str, evidence: ForensicsEvidence, overwrite: bool = False,
          in_use: Mapping[str, str] | None = None) -> Path:
    """Write the page to `path`: whole or not at all; an existing file only with `overwrite`; never a file in
    `in_use` (the model's own sources)."""
    with atomic_write(path, overwrite, in_use, doing="write the report to") as out:
        out.write(page(evidence).encode("utf-8"))
    return Path(path)


def model_files(model: str, sources: Mapping[str, str]) -> dict[str, str]:
    """The files a report must never replace: the model's file and the sources of its program."""
    return {model: "the model file", **{f: "a source file of the model" for f in sources}}


# -- sections -------------------------------------------------------------------------------------------------------

def _header(inv: Investigation) -> str:
    verdict = "Problem found" if inv.problem else "Clean"
    return (f"<h1>Rewind forensics: {escape(_name(inv))}</h1>"
            f'<p class="meta">{escape(inv.program)}: {inv.nodes} nodes on {escape(inv.driver)}, reference '
            f"{escape(inv.reference)}</p>"
            f'<p id="verdict" class="verdict {"problem" if inv.problem else "clean"}">{verdict}</p>')


def _root_cause(inv: Investigation, sources: Mapping[str, str]) -> str:
    node = inv.root
    excerpt = source_excerpt(node, sources) if node is not None else ""
    return (f'<section id="root-cause"><h2>Root cause</h2><p class="headline">{escape(inv.headline)}</p>{excerpt}'
            "</section>")


def source_excerpt(node: Node, sources: Mapping[str, str]) -> str:
    """The lines around a node's source line, its own marked (empty when the source cannot be read)."""
    if node.loc is None:
        return ""
    return source_lines_html(node.loc.file, node.loc.line, sources)


def source_lines_html(file: str, line: int, sources: Mapping[str, str]) -> str:
    """A file's lines around `line` as a table of numbered lines, `line` marked."""
    lines = source_lines(file, sources)
    if not 0 < line <= len(lines):
        return ""
    first, last = max(1, line - CONTEXT_LINES), min(len(lines), line + CONTEXT_LINES)
    rows = "".join(f'<tr{" class=here" if n == line else ""}><td class="n">{n}</td><td><code>'
                   f"{escape(lines[n - 1])}</code></td></tr>" for n in range(first, last + 1))
    return (f'<figure class="source"><figcaption>{escape(Path(file).name)}:{line}</figcaption>'
            f"<table>{rows}</table></figure>")


def source_lines(file: str, sources: Mapping[str, str]) -> list[str]:
    """A source file's lines: the Program's copy of it, else what Python's line cache holds (a notebook cell's)."""
    text = sources.get(file)
    return text.splitlines() if text is not None else [s.rstrip("\n") for s in linecache.getlines(file)]


def _chart(evidence: ForensicsEvidence) -> str:
    worst_by_tick: dict[int, float] = {}
    for row in evidence.rows:
        worst_by_tick[row["tick"]] = max(worst_by_tick.get(row["tick"], 0.0), _number(row["error"]))
    if not worst_by_tick:
        return '<section id="growth"><h2>Error growth</h2><p>No node has a floating output to compare.</p></section>'
    png = errors_png({"each node's worst output": sorted(worst_by_tick.items())}, growth_marks(evidence.investigation),
                     "Error against the reference by tick (x tolerance; above 1 is beyond it)")
    alt = "error against the reference by tick, log scale, with the origin and amplifiers marked"
    return (f'<section id="growth"><h2>Error growth</h2><img id="growth-chart" alt="{alt}" '
            f'src="{data_uri(png)}"></section>')


def growth_marks(inv: Investigation) -> list[Mark]:
    """The ticks an error chart points out: a NaN/Inf birth, the divergence, its origin and amplifiers."""
    marks = []
    if inv.nonfinite is not None:
        marks.append(Mark(inv.nonfinite.tick, f"{_kind(inv.nonfinite)} born in `{op_name(inv.nonfinite.node)}`",
                          "birth"))
    if inv.divergence is not None:
        marks.append(Mark(inv.divergence.tick, f"first divergence: `{op_name(inv.divergence.node)}`", "divergence"))
    if inv.origin is not None:
        marks.append(Mark(inv.origin.tick, f"origin: `{op_name(inv.origin.node)}` at {where(inv.origin.node)}",
                          "origin"))
        marks += [Mark(a.tick, f"{times(a.factor)} by `{op_name(a.node)}`", "amplifier")
                  for a in inv.origin.amplified_by]
    return marks


def _fix(inv: Investigation) -> str:
    parts = []
    for title, found in (("NaN/Inf", inv.nonfinite), ("Divergence", inv.divergence)):
        if found is not None:
            parts.append(_finding(title, found))
    if inv.origin is not None:
        parts.append(_origin(inv.origin))
    if not parts:
        return ""
    return f'<section id="fix"><h2>What went wrong and the fix</h2>{"".join(parts)}</section>'


def _finding(title: str, found: Finding) -> str:
    what = (f"{found.details.count} {_kind(found)} written into '{found.details.value}'" if found.kind == "nonfinite"
            else f"'{found.details.value}' has {found.details.count} element(s) beyond tolerance")
    return (f"<h3>{title}: {escape(found.where())}</h3><p>{escape(what)}</p>{_pattern(found.match)}")


def _origin(origin: Origin) -> str:
    cut = origin.with_origin
    without = (f"; without `{op_name(origin.node)}` they stay at {_ratio(worst(origin.without_after))}"
               if origin.without_origin else "")
    evidence = (f"Confirmed by precision ablation: {len(cut.nodes)} node(s) from `{op_name(origin.node)}` on at higher "
                f"precision take the outputs from {_ratio(worst(cut.before))} to {_ratio(worst(cut.after))} x "
                f"tolerance{without}.")
    return (f"<h3>Root cause upstream: `{escape(op_name(origin.node))}` at {escape(where(origin.node))}</h3>"
            f'<p class="evidence">{escape(evidence)}</p>{_pattern(origin.match)}')


def _pattern(match: Match | None) -> str:
    if match is None:
        return "<p>None of the known failure patterns matches.</p>"
    return (f"<p><b>Pattern:</b> {escape(match.pattern.title)} [{escape(match.pattern.name)}]: "
            f"{escape(match.reason)}</p><p class=\"fix\"><b>Fix:</b> {escape(match.fix)}</p>")


def _ablation(search: Search | None) -> str:
    head = '<section id="ablation"><h2>Precision ablation</h2>'
    if search is None:
        return head + "<p>Not run: the outputs are within tolerance, or it was not asked for.</p></section>"
    if search.found is None:
        return head + f"<p>No precision fix found in {search.trials} trial(s). {escape(search.note)}</p></section>"
    a = search.found
    nodes = ", ".join(f"{n.name} at {d}" for n, d in zip(a.nodes, a.dtypes))
    rows = [[c.value, c.error, f.error, "within" if f.within else "beyond"]
            for c, f in zip(a.before, a.after)]
    return (head + f"<p>{search.trials} trial(s) from checkpoints, no rebuild: running {escape(nodes)} brings the "
            f"outputs within tolerance.</p>"
            + _html_table("ablation-table", ["output", "error before (x tol)", "after", "now"], rows) + "</section>")


def _table(rows: list[dict]) -> str:
    header = ["tick", "node", "op", "source", "value", "dtype", "error (x tol)", "introduced alone", "beyond",
              "NaN/Inf"]
    cells = [[r["tick"], r["node"], r["op"], Path(r["source"]).name if r["source"] else "", r["value"], r["dtype"],
              _number(r["error"]), _number(r["introduced"]["error"]), r["mismatches"], r["nonfinite"]]
             for r in rows[:MAX_TABLE_ROWS]]
    note = (f"<p>The first {MAX_TABLE_ROWS} of {len(rows)} rows; the chart has them all.</p>"
            if len(rows) > MAX_TABLE_ROWS else "")
    return ('<section id="nodes"><h2>Every node against the reference</h2><p>Click a column to sort. Errors are in '
            "units of tolerance; <i>introduced alone</i> is the node's own error on the reference's inputs.</p>"
            + note + f'<div class="scroll">{_html_table("node-table", header, cells, sortable=True)}</div></section>')


def _html_table(ident: str, header: list[str], rows: list[list], sortable: bool = False) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    kind = ' class="sortable"' if sortable else ""
    return f'<table id="{ident}"{kind}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(value: object) -> str:
    """A table cell; a number carries its value for sorting (an infinite error sorts above every finite one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"<td>{escape(str(value))}</td>"
    shown = str(value) if isinstance(value, int) else _ratio(value)
    return f'<td data-sort="{"Infinity" if value == math.inf else value}">{escape(shown)}</td>'


def _name(inv: Investigation) -> str:
    return Path(inv.program).name or "model"


def _kind(found: Finding) -> str:
    return "NaN" if found.details.filter == "nan" else "Inf"


def _number(x) -> float:
    """A number as the JSON of a comparison spells it ("inf", "nan" for the values JSON has no word for)."""
    return float(x)


def _ratio(x: float | str) -> str:
    x = _number(x)
    return "infinite" if math.isinf(x) else "nan" if math.isnan(x) else f"{x:.3g}"


PAGE_STYLE = "body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#222}"
# Scoped to the report's <div>: a notebook shows the same sections inside its own page.
STYLE = """
.rewind-report{font:14px/1.45 system-ui,sans-serif;color:#222}
.rewind-report h1{font-size:1.5em;margin:.2em 0}
.rewind-report h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.rewind-report .meta{color:#666;margin:.2em 0}
.rewind-report .verdict{display:inline-block;padding:.2em .8em;border-radius:1em;font-weight:600}
.rewind-report .verdict.problem{background:#fde2e1;color:#9b1c1c}
.rewind-report .verdict.clean{background:#def7ec;color:#03543f}
.rewind-report .headline{font-size:1.1em;font-weight:600}
.rewind-report figure.source{margin:.5em 0;border:1px solid #ddd;border-radius:4px;overflow:auto}
.rewind-report figure.source figcaption{background:#f5f5f5;padding:.2em .6em;font-family:monospace}
.rewind-report figure.source td.n{color:#999;text-align:right;padding-right:1em;user-select:none}
.rewind-report figure.source tr.here{background:#fff3c4}.rewind-report figure.source code{white-space:pre}
.rewind-report .scroll{overflow-x:auto}
.rewind-report img{max-width:100%;height:auto}
.rewind-report table{border-collapse:collapse;font-size:13px}
.rewind-report th,.rewind-report td{border:1px solid #e2e2e2;padding:.15em .5em;text-align:left}
.rewind-report table.sortable th{cursor:pointer;background:#f5f5f5}
.rewind-report .fix{background:#eef6ff;padding:.4em .6em;border-left:3px solid #3b82f6}
.rewind-report pre{white-space:pre-wrap;font-size:12px}
"""

# Sorts the per-node table by the column clicked (again: the other way); marks the page ready for the tests, and
# records a script error on the body, where a headless browser's DOM dump shows it.
SCRIPT = """
window.addEventListener("error", e => { document.body.dataset.error = String(e.message); });
document.querySelectorAll("table.sortable th").forEach((th, col) => th.addEventListener("click", () => {
  const body = th.closest("table").tBodies[0], up = th.dataset.order !== "up";
  th.dataset.order = up ? "up" : "down";
  const key = row => { const c = row.cells[col], n = parseFloat(c.dataset.sort); return isNaN(n) ? c.textContent : n; };
  const order = (a, b) => typeof a === "number" && typeof b === "number" ? (a - b || 0)
    : String(a).localeCompare(String(b));
  [...body.rows].sort((a, b) => (up ? 1 : -1) * order(key(a), key(b))).forEach(row => body.appendChild(row));
}));
document.body.dataset.ready = "sortable";
"""
