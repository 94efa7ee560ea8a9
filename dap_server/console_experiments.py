"""The console's experiments (`rewind debug`): patches on named branches of the frozen pass, measured
against the reference and the original, compared and undone, and the repair loop; through the same
DAP requests an editor sends (docs/protocol.md, "Experiments and the repair loop")."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from types import ModuleType
from typing import Callable

from dap_server.client import DapClient
from dap_server.console_result import Command, CommandError, Result, table, whole_number

RUN_S = 3600.0  # installing or measuring a branch runs part of the pass (minutes on a large model): only a hang fails
REPAIR_MARGIN_S = 60.0  # the repair loop stops itself at its time limit
_EDIT = re.compile(r"^([\w.]+)\[([\d,\s]*)\]\s*=?\s*(\S+)$")


class ExperimentCommands:
    """The experiment commands of the Console (dap_server/console.py), which supplies `client`."""

    client: DapClient

    def experiment_commands(self) -> list[Command]:
        return [
            Command(("patch",), self.cmd_patch, "patch precision NODE DTYPE | patch function NODE FILE [FUNCTION] | "
                    "patch attributes NODE KEY=VALUE ... | patch optimizer KEY=VALUE ... | patch edit "
                    "VALUE[I,J,...] NUMBER, then [as NAME] [in BRANCH] [--from-step K]",
                    "patch a node (a name, an op or a module path), or a training step's optimizer (lr=0.01), on a "
                    "branch (from step K on), and install it"),
            Command(("patches",), self.cmd_patches, "patches", "list the branches and their patches (* installed)"),
            Command(("unpatch",), self.cmd_unpatch, "unpatch NAME [in BRANCH]", "remove a patch"),
            Command(("branch",), self.cmd_branch, "branch NAME", "install a branch"),
            Command(("undo",), self.cmd_undo, "undo", "the recorded pass back, bit for bit"),
            Command(("measure",), self.cmd_measure, "measure [BRANCH] [--outputs]",
                    "a branch's errors against the reference and the original, node by node"),
            Command(("repair",), self.cmd_repair, "repair [--fix FILE ...] [--suggest] [...]",
                    "the repair loop, as rewind repair: validate fixes and record the ones that hold"),
            Command(("suggest",), self.cmd_suggest, "suggest [--limit N]",
                    "the knowledge base's candidate fixes for this pass's findings"),
            Command(("compare-with",), self.cmd_compare_with, "compare-with CANDIDATE --against REF [--function NAME] "
                    "[--inputs FILE:FN] [--validate]", "a candidate model or function against a trusted one, down "
                    "to the line where they part (--validate: on the coverage suite), as rewind compare"),
        ]

    def _request(self, command: str, arguments: dict | None = None, timeout: float = RUN_S) -> dict:
        return self.client.request(command, arguments, timeout=timeout)

    def cmd_patch(self, args: str) -> Result:
        step: dict = {}
        words, options = _trailing_options(_from_step(args.split(), step))
        kind = words[0] if words else ""
        if kind not in PATCH_KINDS:
            raise CommandError(f"usage: patch {'|'.join(PATCH_KINDS)} ... [as NAME] [in BRANCH] [--from-step K] "
                               "(see: help)")
        fields, name = PATCH_KINDS[kind](words[1:])
        name = options.pop("name", name)
        body = self._request("addPatch", {"name": name, **options, **step, **fields})
        return Result(f"added patch '{name}' to branch '{body['active']}' (installed)\n{describe_listing(body)}", body)

    def cmd_patches(self, args: str) -> Result:
        _no_arguments("patches", args)
        body = self._request("listPatches")
        return Result(describe_listing(body), body)

    def cmd_unpatch(self, args: str) -> Result:
        words, options = _trailing_options(args.split())
        if len(words) != 1 or "name" in options:
            raise CommandError("usage: unpatch NAME [in BRANCH] (see: patches)")
        body = self._request("removePatch", {"name": words[0], **options})
        return Result(f"removed patch '{words[0]}'\n{describe_listing(body)}", body)

    def cmd_branch(self, args: str) -> Result:
        if len(args.split()) != 1:
            raise CommandError(f"usage: branch NAME (see: patches; '{_original()}' or undo: the recorded pass)")
        body = self._request("restoreBranch", {"branch": args.strip()})
        return Result(f"installed branch '{body['active']}'\n{describe_listing(body)}", body)

    def cmd_undo(self, args: str) -> Result:
        _no_arguments("undo", args)
        body = self._request("restoreBranch", {"branch": _original()})
        return Result(f"the recorded pass is back ({_original()} installed)\n{describe_listing(body)}", body)

    def cmd_measure(self, args: str) -> Result:
        words = args.split()
        branch = [w for w in words if w != "--outputs"]
        if len(branch) > 1:
            raise CommandError("usage: measure [BRANCH] [--outputs] (default: the installed branch)")
        body = self._request("measureBranch", {**({"branch": branch[0]} if branch else {}),
                                                     "nodes": "--outputs" not in words})
        return Result(describe_measurement(body), body)

    def compare_branches(self, args: str) -> Result:
        """`compare BRANCH [BRANCH ...]` (the `compare` command is dap_server/console_numerics.py's)."""
        body = self._request("compareBranches", {"branches": args.split()})
        return Result(describe_comparison(body), body)

    def cmd_repair(self, args: str) -> Result:
        a = _Arguments("repair", _repair_cli().add_loop_arguments).parse(args)
        fixes = [{"text": _read(f), "name": Path(f).name} for f in a.fix]
        body = self._request("repair", {
            "fixes": fixes, "suggest": a.suggest or not fixes, "maxAttempts": a.max_attempts,
            "timeLimit": a.time_limit, "seeds": a.seeds, "scales": list(a.scales), "shapes": a.shapes,
            **({"knowledge": a.knowledge} if a.knowledge else {})}, timeout=a.time_limit + REPAIR_MARGIN_S)
        return Result(_repair_cli().render(body), body)

    def cmd_compare_with(self, args: str) -> Result:
        a = _COMPARE.parse(args)
        fields = {"candidate": _client_path(a.candidate), "against": _client_path(a.against),
                  **({"function": a.function} if a.function else {}),
                  **({"inputs": _client_path(a.inputs)} if a.inputs else {})}
        body = self._request("validateCandidate" if a.validate else "compareCandidate", fields)
        return Result((_candidates().render_validation if a.validate else _candidates().render)(body), body)

    def cmd_suggest(self, args: str) -> Result:
        a = _SUGGEST.parse(args)
        body = self._request("suggestFixes", {"limit": a.limit, **({"knowledge": a.knowledge} if a.knowledge
                                                                          else {})})
        return Result(describe_suggestions(body), body)


# -- patch kinds: the words after `patch KIND` -> addPatch's fields for the change, and a default name --------

def _precision(words: list[str]) -> tuple[dict, str]:
    if len(words) != 2:
        raise CommandError("usage: patch precision NODE DTYPE (float64, float32, float16, bfloat16)")
    node, dtype = words
    return {"node": node, "precision": dtype}, f"{node}-{dtype}"


def _function(words: list[str]) -> tuple[dict, str]:
    if len(words) not in (2, 3):
        raise CommandError("usage: patch function NODE FILE [FUNCTION] (FILE: Python defining the function)")
    node, file, *entry = words
    fields = {"node": node, "function": _read(file), **({"entry": entry[0]} if entry else {})}
    return fields, f"{node}-{entry[0] if entry else Path(file).stem}"


def _attributes(words: list[str]) -> tuple[dict, str]:
    if len(words) < 2:
        raise CommandError("usage: patch attributes NODE KEY=VALUE ... (VALUE: a Python literal, eps=1e-3)")
    node, *pairs = words
    attributes = dict(_attribute(p) for p in pairs)
    return {"node": node, "attributes": attributes}, f"{node}-{'-'.join(attributes)}"


def _attribute(pair: str) -> tuple[str, object]:
    key, equals, text = pair.partition("=")
    if not key or not equals:
        raise CommandError(f"'{pair}' is not KEY=VALUE")
    try:
        return key, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise CommandError(f"{key}={text}: the value is not a Python literal (a number, 'text', True, [1, 2])") \
            from None


def _optimizer(words: list[str]) -> tuple[dict, str]:
    if not words:
        raise CommandError("usage: patch optimizer KEY=VALUE ... (a training step's hyperparameters: lr=0.01, "
                           "eps=1e-4, betas=(0.9,0.99))")
    changes = dict(_attribute(p) for p in words)
    return {"optimizer": changes}, f"optimizer-{'-'.join(changes)}"


def _edit(words: list[str]) -> tuple[dict, str]:
    match = _EDIT.match(" ".join(words))
    if not match:
        raise CommandError("usage: patch edit VALUE[I,J,...] NUMBER (one element of a node's output)")
    value, index, number = match.groups()
    at = [whole_number(i.strip(), "patch edit VALUE[I,J,...] NUMBER takes whole numbers in [I,J,...]")
          for i in index.split(",") if i.strip()]
    try:
        fields = {"edit": {"value": value, "index": at, "set": float(number)}}
    except ValueError:
        raise CommandError(f"an edit sets a number, got '{number}'") from None
    return fields, f"{value}[{','.join(map(str, fields['edit']['index']))}]"


PATCH_KINDS: dict[str, Callable[[list[str]], tuple[dict, str]]] = {
    "precision": _precision, "function": _function, "attributes": _attributes, "optimizer": _optimizer,
    "edit": _edit}


def _from_step(words: list[str], options: dict) -> list[str]:
    """The words without `--from-step K` (anywhere), K put in `options` as addPatch's fromStep."""
    if "--from-step" not in words:
        return words
    at = words.index("--from-step")
    usage = "--from-step takes one step number (0 is the first step), once"
    if at + 1 >= len(words) or words.count("--from-step") > 1:
        raise CommandError(usage)
    options["fromStep"] = whole_number(words[at + 1], usage)
    return words[:at] + words[at + 2:]


def _trailing_options(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """The words before a trailing `as NAME` and `in BRANCH` (either order, each once), and those two."""
    options: dict[str, str] = {}
    while len(words) >= 3 and words[-2] in ("as", "in"):
        key = "name" if words[-2] == "as" else "branch"
        if key in options:
            raise CommandError(f"'{words[-2]}' is given twice")
        options[key], words = words[-1], words[:-2]
    return words, options


def _no_arguments(command: str, args: str) -> None:
    if args:
        raise CommandError(f"{command} takes no arguments")


def _read(file: str) -> str:
    try:
        return Path(file).read_text()
    except OSError as exc:
        raise CommandError(f"cannot read {file}: {exc.strerror}") from None


class _Arguments(argparse.ArgumentParser):
    """A console command's options, parsed as argparse would; a mistake is a CommandError, never an exit."""

    def __init__(self, prog: str, add: Callable[[argparse.ArgumentParser], None]):
        super().__init__(prog=prog, add_help=False)
        add(self)

    def parse(self, args: str) -> argparse.Namespace:
        return self.parse_args(args.split())

    def error(self, message: str):
        raise CommandError(f"{message} ({self.format_usage().strip()})")


def _suggest_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=3, help="candidates at most")
    parser.add_argument("--knowledge", metavar="PATH", help="the knowledge base file (default: in the user's cache)")


_SUGGEST = _Arguments("suggest", _suggest_arguments)


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("candidate")
    parser.add_argument("--against", required=True)
    parser.add_argument("--function")
    parser.add_argument("--inputs")
    parser.add_argument("--validate", action="store_true")


_COMPARE = _Arguments("compare-with", _compare_arguments)
_SIDE_FILE = re.compile(r"^(?P<file>.+?\.py)(?P<rest>[@:].*)?$")


def _client_path(side: str) -> str:
    """A side as the console's folder names it, made absolute for the server (a driver stays as it is)."""
    found = _SIDE_FILE.match(side)
    if side.startswith(("torch:", "sim")) or found is None:
        return side
    return str(Path(found["file"]).resolve()) + (found["rest"] or "")


# -- reports ----------------------------------------------------------------------------------------------

# provenance's words for what the server sends back, imported when first shown: provenance runs models, so it imports
# torch (seconds), which this client of the server otherwise never needs.

def _original() -> str:
    """The name of the recorded pass among the branches."""
    from provenance.experiments import ORIGINAL  # deferred: provenance imports torch (see above)
    return ORIGINAL


def _repair_cli() -> ModuleType:
    from provenance import repair_cli  # deferred: provenance imports torch (see above)
    return repair_cli


def _candidates() -> ModuleType:
    from provenance.candidates import report  # deferred, as the others (this one imports no torch)
    return report


def describe_finding(finding: dict) -> str:
    return _repair_cli().describe_finding(finding)


def describe_listing(listing: dict) -> str:
    """The branches and their patches, `*` marking the installed one."""
    original = _original()
    lines = [f"{'*' if listing['active'] == original else ' '} {original} (the recorded pass)"]
    for branch in listing["branches"]:
        mark = "*" if branch["name"] == listing["active"] else " "
        lines.append(f"{mark} {branch['name']}, patched from tick {branch['tick']}")
        lines += [f"    {_describe_patch(p)}" for p in branch["patches"]]
    return "\n".join(lines)


def _describe_patch(patch: dict) -> str:
    nodes = [f"{n['node']} (tick {n['tick']}{_at(n['source'])})" for n in patch["nodes"]]
    more = f" and {len(nodes) - 3} more" if len(nodes) > 3 else ""
    return f"{patch['name']}: {', '.join(nodes[:3])}{more} {patch['description']}"


def describe_measurement(m: dict) -> str:
    lines = [f"branch {m['branch']}, patched from tick {m['tick']} (errors in units of tolerance)"]
    lines += table(["output", "vs reference", "original vs reference", "vs original"],
                   [[o["value"], comparison_text(o["reference"]), comparison_text(o["originalReference"]),
                     comparison_text(o["original"])] for o in m["outputs"]])
    if m["nodes"]:
        lines.append(f"nodes from tick {m['tick']} against the reference (* patched):")
        lines += table(["tick", "node", "op", "error", "original", "time", "original"],
                       [[str(n["tick"]), n["node"] + ("*" if n["patch"] else ""), n["op"], ratio_text(n["error"]),
                         ratio_text(n["originalError"]), _time(n["seconds"]), _time(n["originalSeconds"])]
                        for n in m["nodes"]])
    if "lossCurve" in m:
        lines.append("the loss at each step:")
        lines += table(["step", "original", "patched", "patched - original"],
                       [[str(r["step"]), _number(r["original"]), _number(r["patched"]), _difference(r)]
                        for r in m["lossCurve"]])
    lines.append(f"time from tick {m['tick']}: {_time(m['seconds'])} (original {_time(m['originalSeconds'])})")
    return "\n".join(lines)


def _number(x: float | str) -> str:
    return x if isinstance(x, str) else f"{x:.6g}"


def _difference(row: dict) -> str:
    """The patched loss minus the original's (`same` where they are equal bit for bit)."""
    a, b = row["patched"], row["original"]
    if a == b:
        return "same"
    return "-" if isinstance(a, str) or isinstance(b, str) else f"{a - b:+.3g}"


def describe_comparison(c: dict) -> str:
    names = c["branches"]
    lines = ["outputs against the reference (errors in units of tolerance):"]
    lines += table(["output", _original(), *names],
                   [[o["value"], comparison_text(o["original"]), *(comparison_text(o["branches"][b]["reference"])
                                                                for b in names)] for o in c["outputs"]])
    lines.append("nodes against the reference (* the branch patches it):")
    lines += table(["tick", "node", "op", _original(), *names],
                   [[str(n["tick"]), n["node"], n["op"], ratio_text(n["original"]["error"]),
                     *(_branch_error(n["branches"].get(b)) for b in names)] for n in c["nodes"]])
    lines.append("time from the patch point: " + ", ".join(f"{b} {_time(c['seconds'][b])}" for b in names))
    return "\n".join(lines)


def describe_suggestions(body: dict) -> str:
    if not body["findings"]:
        return "no findings: no NaN/Inf, no divergence from the reference"
    lines = [f"finding: {describe_finding(f)}" for f in body["findings"]]
    for s in body["suggestions"]:
        patches = "; ".join(f"{p['node']} {p['description']}" for p in s["patches"])
        note = f", {s['note']}" if s["note"] else ""
        lines.append(f"suggested for {s['finding']}: {s['name']} ({s['origin']}{note}): {patches}")
    if not body["suggestions"]:
        lines.append("no suggestions for these findings (repair --fix FILE tries a fix of yours)")
    return "\n".join(lines)


def comparison_text(c: dict) -> str:
    """`within (0.3)` or `48 beyond (inf), 48 NaN/Inf`: a comparison against the reference, errors in tolerances."""
    state = "within" if c["within"] else f"{c['mismatches']} beyond"
    nonfinite = f", {c['nonfinite']} NaN/Inf" if c["nonfinite"] else ""
    return f"{state} ({ratio_text(c['error'])}){nonfinite}"


def _branch_error(row: dict | None) -> str:
    return "-" if row is None else ratio_text(row["error"]) + ("*" if row["patch"] else "")


def ratio_text(x: float | str) -> str:
    return x if isinstance(x, str) else f"{x:.3g}"


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3g} ms" if seconds < 1 else \
        f"{seconds:.3g} s"


def _at(source: str | None) -> str:
    return f", {Path(source).name}" if source else ""
