"""The console's numerics (`rewind debug`): every node against the reference, the first divergence, precision
ablation, a name's reference value, the timeline's events, a name's writes across the run, a value at two ticks,
a histogram, and the first tick where an expression holds; through the DAP requests an editor sends
(docs/protocol.md, "Numerical forensics" and "Numerics across ticks"). Each prints a table or a few lines, and
in --json mode the request's answer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from dap_server.console_experiments import ExperimentCommands, comparison_text, describe_finding, ratio_text
from dap_server.console_result import Command, CommandError, Result, table, whole_number

COMPARE = "compare [--from T] [--count N] | compare BRANCH [BRANCH ...]"
ABLATE = "ablate NODE [NODE ...] [--dtype D] | ablate --search [--dtype D] [--max-trials N]"
FIND = "find EXPR [--from T] [--max-ticks N] [--no-move]"
BAR = 40  # characters of the longest histogram bar
_TOKEN = re.compile(r"\S+")


class NumericsCommands(ExperimentCommands):
    """The numerics commands of the Console (dap_server/console.py), which supplies `breakpoints`, `_motion`,
    `_frame_id` (the selected frame's) and `_of_rank` (with ranks, the selected rank's thread: each rank counts its
    own ticks); `compare` without branches is the reference table, with them the experiments' comparison."""

    breakpoints: list
    _motion: Callable[[str, dict | None], Result]
    _frame_id: Callable[[], int]
    _of_rank: Callable[[], dict]

    def numerics_commands(self) -> list[Command]:
        return [
            Command(("compare",), self.cmd_compare, COMPARE, "every node's error against the reference, introduced "
                    "by the node or inherited from its inputs (with BRANCHes: those branches side by side)"),
            Command(("first-divergence",), self.cmd_first_divergence, "first-divergence [--from T]",
                    "the first node that leaves the reference, why, and how its error grows to the outputs"),
            Command(("ablate",), self.cmd_ablate, ABLATE, "run nodes at higher precision and measure the outputs "
                    "(--search: find a small set that fixes them); the recorded pass stays"),
            Command(("reference",), self.cmd_reference, "reference NAME",
                    "the reference's value of a name (its stats) and this pass's against it at the position"),
            Command(("timeline",), self.cmd_timeline, "timeline [--from T] [--count N]",
                    "what happens where: breakpoint stops, births of NaN/Inf, checkpoints, by tick"),
            Command(("history",), self.cmd_history, "history NAME [--max N]",
                    "every write over the run to what a variable (anywhere) or $value names, with stats"),
            Command(("diff",), self.cmd_diff, "diff NAME TICK1 TICK2",
                    "a name (or expression) at two ticks: shapes, elements that differ, the first, max |difference|"),
            Command(("hist",), self.cmd_hist, "hist NAME [--bins N]",
                    "a histogram of a name's (or expression's) finite elements; NaN and Inf counted apart"),
            Command(("find",), self.cmd_find, FIND, "go to the first tick (after the position, or from T) where "
                    "EXPR holds; ticks where a name of it is not defined yet are skipped"),
        ]

    def cmd_compare(self, args: str) -> Result:
        rest, options = parse_options(args, COMPARE, {"from": int, "count": int})
        if rest:
            if options:
                raise CommandError(f"--from and --count go with the reference table, not with branches ({COMPARE})")
            return self.compare_branches(rest)
        body = self._request("compareWithReference", {"start": options.get("from", 0), "introduced": True,
                                                      **self._of_rank(),
                                                      **({"count": options["count"]} if "count" in options else {})})
        return Result(describe_reference_table(body), body)

    def cmd_first_divergence(self, args: str) -> Result:
        rest, options = parse_options(args, "first-divergence [--from T]", {"from": int})
        _no_words("first-divergence [--from T]", rest)
        body = self._request("firstDivergence", {"start": options.get("from", 0)})
        return Result(describe_divergence(body), body)

    def cmd_ablate(self, args: str) -> Result:
        rest, options = parse_options(args, ABLATE, {"search": bool, "dtype": str, "max-trials": int})
        if bool(rest) == bool(options.get("search")):
            raise CommandError(f"name the nodes, or --search (usage: {ABLATE})")
        choice = {"search": True} if rest == "" else {"nodes": rest.split()}
        body = self._request("ablatePrecision", {**choice, **({"dtype": options["dtype"]} if "dtype" in options else {}),
                                                 **({"maxTrials": options["max-trials"]}
                                                    if "max-trials" in options else {})})
        return Result(describe_ablation(body), body)

    def cmd_reference(self, args: str) -> Result:
        if len(args.split()) != 1:
            raise CommandError("usage: reference NAME (a variable of the selected frame, or $value)")
        body = self._request("referenceValue", {"name": args.strip(), "frameId": self._frame_id()})
        return Result(describe_reference(args.strip(), body), body)

    def cmd_timeline(self, args: str) -> Result:
        rest, options = parse_options(args, "timeline [--from T] [--count N]", {"from": int, "count": int})
        _no_words("timeline [--from T] [--count N]", rest)
        body = self._request("timelineEvents", {"start": options.get("from", 0), **self._of_rank(),
                                                **({"count": options["count"]} if "count" in options else {})})
        for event in body["events"]:
            if event["event"] == "stop":  # the console's own breakpoint numbers, as its stops show them
                event["breakpoints"] = [bp.number for bp in self.breakpoints if bp.server_id in event["breakpoints"]]
        return Result(describe_timeline(body), body)

    def cmd_history(self, args: str) -> Result:
        rest, options = parse_options(args, "history NAME [--max N]", {"max": int})
        if len(rest.split()) != 1:
            raise CommandError("usage: history NAME [--max N] (a variable of the program, or $value)")
        body = self._request("writeHistory", {"name": rest, **self._of_rank(),
                                              **({"maxWrites": options["max"]} if "max" in options else {})})
        return Result(describe_history(rest, body), body)

    def cmd_diff(self, args: str) -> Result:
        usage = "usage: diff NAME TICK1 TICK2 (NAME: a variable, $value or an expression; ticks: whole numbers)"
        parts = args.rsplit(maxsplit=2)
        if len(parts) != 3:
            raise CommandError(usage)
        ticks = [whole_number(tick, usage) for tick in parts[1:]]
        body = self._request("valueDiff", {"expression": parts[0], "ticks": ticks, **self._of_rank()})
        return Result(describe_diff(parts[0], body), body)

    def cmd_hist(self, args: str) -> Result:
        rest, options = parse_options(args, "hist NAME [--bins N]", {"bins": int})
        if not rest:
            raise CommandError("usage: hist NAME [--bins N] (NAME: a variable, $value or an expression)")
        body = self._request("histogram", {"expression": rest, "frameId": self._frame_id(),
                                           **({"bins": options["bins"]} if "bins" in options else {})})
        return Result(describe_histogram(rest, body), body)

    def cmd_find(self, args: str) -> Result:
        rest, options = parse_options(args, FIND, {"from": int, "max-ticks": int, "no-move": bool})
        if not rest:
            raise CommandError(f"usage: {FIND}")
        body = self._request("findTick", {"expression": rest, **self._of_rank(),
                                          **({"start": options["from"]} if "from" in options else {}),
                                          **({"maxTicks": options["max-ticks"]} if "max-ticks" in options else {})})
        text = describe_found(rest, body)
        if body["tick"] is None or options.get("no-move"):
            return Result(text, body)
        stop = self._motion("goto", {"targetId": body["tick"] + 1})
        return Result(f"{text}\n{stop.text}", {**body, "stop": stop.data})


def parse_options(args: str, usage: str, options: dict[str, type]) -> tuple[str, dict[str, Any]]:
    """`args` without the options `options` names (`--from 3`; a bool option is a flag), and their values. The
    text left keeps its spacing: it may be an expression."""
    found: dict[str, Any] = {}
    tokens = list(_TOKEN.finditer(args))
    pieces, kept_from, i = [], 0, 0
    while i < len(tokens):
        word = tokens[i].group()
        if not (word.startswith("--") and word[2:3].isalpha()):
            i += 1
            continue
        key, kind = word[2:], options.get(word[2:])
        if kind is None:
            known = ", ".join(f"--{o}" for o in options)
            raise CommandError(f"unknown option {word}; {usage.split()[0]} takes {known} (usage: {usage})")
        if key in found:
            raise CommandError(f"{word} is given twice")
        pieces.append(args[kept_from:tokens[i].start()])
        if kind is bool:
            found[key], kept_from, i = True, tokens[i].end(), i + 1
            continue
        if i + 1 == len(tokens):
            raise CommandError(f"{word} needs a value (usage: {usage})")
        found[key], kept_from, i = _option_value(word, tokens[i + 1].group(), kind), tokens[i + 1].end(), i + 2
    pieces.append(args[kept_from:])
    return "".join(pieces).strip(), found


def _option_value(option: str, text: str, kind: type) -> Any:
    return whole_number(text, f"{option} takes a whole number, 0 or more") if kind is int else text


def _no_words(usage: str, rest: str) -> None:
    if rest:
        raise CommandError(f"'{rest[:40]}' is not an option here (usage: {usage})")


# -- reports ----------------------------------------------------------------------------------------------
def describe_reference_table(body: dict) -> str:
    lines = [f"every node against the reference {body['reference']} (errors in units of tolerance: above 1 is "
             "beyond it; introduced: the node alone, on the reference's inputs):"]
    lines += table(["tick", "node", "op", "error", "introduced", "verdict", "beyond", "NaN/Inf"],
                   [[str(r["tick"]), r["node"], r["op"], ratio_text(r["error"]), ratio_text(r["introduced"]["error"]),
                     r["verdict"], str(r["mismatches"]), str(r["nonfinite"])] for r in body["rows"]])
    lines.append("outputs: " + "; ".join(f"{o['value']} {comparison_text(o)}" for o in body["outputs"]))
    return "\n".join(lines)


def describe_divergence(body: dict) -> str:
    found = body["divergence"]
    if found is None:
        return f"no divergence: {body['divergenceReason']}"
    observed, introduced = found["observed"], found["introduced"]
    lines = [f"first divergence: {describe_finding(found)}",
             f"  tick {found['tick']}, value {found['value']}: error {ratio_text(observed['error'])}, introduced by "
             f"the node alone {ratio_text(introduced['error'])}; {found['count']} element(s) beyond tolerance"]
    if found["pattern"]:
        lines.append(f"  why: {found['pattern']['reason']}\n  fix: {found['pattern']['fix']}")
    lines.append("  how the error grows:")
    lines += table(["tick", "node", "op", "error", "max |diff|", "beyond"],
                   [[str(g["tick"]), g["node"], g["op"], ratio_text(g["error"]), ratio_text(g["maxAbs"]),
                     str(g["mismatches"])] for g in found["growth"]], indent="    ")
    return "\n".join(lines)


def describe_ablation(body: dict) -> str:
    if "search" in body:
        s = body["search"]
        if s["found"] is None:
            return f"no precision fix found in {s['trials']} trial(s): {s['foundReason']}"
        return f"found in {s['trials']} trial(s): {_ablated(s['found'])}"
    return _ablated(body["ablation"])


def _ablated(a: dict) -> str:
    nodes = ", ".join(f"{n['node']} at {n['dtype']}" for n in a["nodes"])
    lines = [f"ran {nodes}: the outputs are {'fixed' if a['fixed'] else 'not fixed'}"]
    lines += table(["output", "before", "after"], [[b["value"], comparison_text(b), comparison_text(f)]
                                                   for b, f in zip(a["before"], a["after"])])
    return "\n".join(lines)


def describe_reference(name: str, body: dict) -> str:
    ref = body["referenceValue"]
    lines = [f"{name} ({body['value']}) in the reference {body['reference']}: {ref['dtype']}{ref['shape']} "
             f"{stats_text(ref['stats'])}"]
    if body["pass"] is None:
        lines.append(f"this pass: {body['passReason']}")
        return "\n".join(lines)
    mine, c = body["pass"], body["comparison"]
    cosine = ratio_text(c["cosine"]) if c["cosine"] is not None else f"none ({c['cosineReason']})"
    lines += [f"this pass at tick {body['tick']}: {mine['dtype']}{mine['shape']} {stats_text(mine['stats'])}",
              f"against the reference: {comparison_text(c)}, max |diff| {ratio_text(c['maxAbs'])}, cosine {cosine}"]
    return "\n".join(lines)


def describe_timeline(body: dict) -> str:
    lines = [f"ticks {body['start']} to {body['stop'] - 1} of {body['end']} (position {body['position']}):"]
    lines += [f"  tick {e['tick']:<6} {e['event']:<10} {_event(e)}" for e in body["events"]]
    return "\n".join(lines) if body["events"] else lines[0] + " no stops, births or checkpoints"


def _event(e: dict) -> str:
    if e["event"] == "checkpoint":
        return f"{e['values']} values, {e['bytes']} bytes ({e['tier']})"
    if e["event"] == "stop":
        numbers = ", ".join(map(str, e["breakpoints"]))
        return f"{e['reason']} {numbers}" if numbers else e["description"]
    fate = "reaches an output" if e["reachesOutput"] else (
        "absorbed at " + ", ".join(n["node"] for n in e["absorbedAt"]) if e["absorbedAt"] else "goes no further")
    where = f" at {_file_line(e['source'])}" if e["source"] else ""
    return f"{e['count']} {e['kind'].upper()} in {e['value']}, written by {e['node']} ({e['op']}){where}: {fate}"


def describe_history(name: str, body: dict) -> str:
    writes = body["writes"]
    head = f"{name}: {body['total']} write(s) over the run to {', '.join(body['values']) or 'no value'}"
    if body.get("truncated"):
        head += f" ({body['truncated']})"
    rows = [[str(w["tick"]), w["value"], w["node"] or "edit", w["kind"], *_stat_cells(w["stats"]),
             w["digest"] or "-"] for w in writes]
    return "\n".join([head, *table(["tick", "value", "node", "kind", "min", "max", "mean", "nan", "inf", "digest"],
                                   rows)]) if rows else head


def describe_diff(expression: str, body: dict) -> str:
    left, right = body["left"], body["right"]
    lines = [f"{expression} at tick {side['tick']}: {side['dtype']}{side['shape']} {stats_text(side['stats'])}"
             for side in (left, right)]
    if not body["sameShape"]:
        return "\n".join([*lines, body["differingReason"]])
    if not body["differing"]:
        return "\n".join([*lines, f"identical: no element of {left['numel']} differs"])
    first = body["firstDifference"]
    biggest = ratio_text(body["maxAbsDiff"]) if body["maxAbsDiff"] is not None else body["maxAbsDiffReason"]
    lines.append(f"{body['differing']} of {left['numel']} element(s) differ; max |difference| {biggest}; first at "
                 f"{first['index']}: {ratio_text(first['left'])} then {ratio_text(first['right'])}")
    return "\n".join(lines)


def describe_histogram(expression: str, body: dict) -> str:
    head = (f"{expression} at tick {body['tick']}: {body['dtype']}{body['shape']}, {body['finite']} finite, "
            f"{body['nan']} NaN, {body['posinf']} +Inf, {body['neginf']} -Inf")
    if body["bins"] is None:
        return f"{head}\n  {body['binsReason']}"
    edges, counts = body["bins"]["edges"], body["bins"]["counts"]
    most = max(counts) or 1
    rows = [[f"[{edges[i]:.4g}, {edges[i + 1]:.4g}{']' if i == len(counts) - 1 else ')'}", str(c),
             "#" * round(BAR * c / most)] for i, c in enumerate(counts)]
    return "\n".join([head, *table(["bin", "count", ""], rows)])


def describe_found(expression: str, body: dict) -> str:
    looked = f"{body['scanned']} tick(s) looked at"
    if body["skipped"]:
        looked += f", {body['skipped']} skipped where a name was not defined yet ({body['skipReason']})"
    if body["tick"] is None:
        return f"{expression}: {body['tickReason']} ({looked})"
    return f"{expression} holds first at tick {body['tick']} ({looked})"


def stats_text(stats: dict) -> str:
    mn, mx, mean, nan, inf = _stat_cells(stats)
    return f"min={mn} max={mx} mean={mean} nan={nan} inf={inf}"


def _stat_cells(stats: dict | None) -> list[str]:
    if stats is None:
        return ["-"] * 5
    return [("-" if stats[k] is None else ratio_text(stats[k])) for k in ("min", "max", "mean")] + \
        [str(stats["nan"]), str(stats["inf"])]


def _file_line(source: str) -> str:
    file, _, line = source.rpartition(":")
    return f"{Path(file).name}:{line}"
