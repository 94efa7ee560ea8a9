"""The failure-pattern knowledge base: pattern -> fix.

One thing with three parts: the patterns themselves (provenance/patterns.py: a rule over the
evidence, a title, advice in words), the built-in recipes that turn that advice into candidate
patches (provenance/recipes.py), and the fixes that validated, recorded in a JSON file and
suggested first for new findings of the same pattern, most often validated first.

A recorded fix is relative to its finding, so it carries over to another program: each patched
node is named by its op and its distance from the finding's node in the graph (-2: two producers
up, +1: a consumer; a node neither up nor downstream of it is named by its name).
The file defaults to the user's cache directory (`$REWIND_KNOWLEDGE`, else
`$XDG_CACHE_HOME/rewind/fixes.json`, else `~/.cache/rewind/fixes.json`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import deque
from itertools import chain
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one recording session at a time
    fcntl = None

from checkpoint.branch import AttributePatch, FunctionPatch, Patch, PrecisionPatch
from hardware.errors import RewindError, echo, os_reason
from hardware.program import Program
from provenance import recipes
from provenance.fixes import Candidate, FunctionSource, function_from
from provenance.forensics import Finding, Forensics
from provenance.integrity import scan_source
from provenance.program_edits import ProgramEdit
from provenance.steps import is_training

FORMAT = "rewind-fixes/1"


def default_path() -> Path:
    chosen = os.environ.get("REWIND_KNOWLEDGE")
    if chosen:
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rewind" / "fixes.json"


class KnowledgeBase:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.fixes: list[dict] = self._load()

    def _load(self) -> list[dict]:
        try:
            if not self.path.is_file():
                return []
            saved = json.loads(self.path.read_text())
        except OSError as exc:
            raise RewindError(f"the knowledge base {echo(str(self.path), 200)} cannot be read: {os_reason(exc)}") \
                from None
        except ValueError as exc:
            raise RewindError(f"the knowledge base {echo(str(self.path), 200)} is not JSON: {exc}") from None
        if not isinstance(saved, dict) or saved.get("format") != FORMAT or not isinstance(saved.get("fixes"), list):
            raise RewindError(f"{self.path} is not a knowledge base of fixes (format {FORMAT})")
        return [self._migrated(i, e) for i, e in enumerate(saved["fixes"], 1)]

    def _migrated(self, number: int, entry: object) -> dict:
        """An entry as read, checked field by field, with the evidence an older file did not keep filled in
        (its validations passed on the input sets it lists; it was never rejected)."""
        where = f"the knowledge base {echo(str(self.path), 200)}: entry {number}"
        if not isinstance(entry, dict):
            raise RewindError(f"{where} is not a recorded fix")
        for key, kind in (("pattern", str), ("name", str), ("patches", list), ("validations", int)):
            if not isinstance(entry.get(key), kind) or isinstance(entry.get(key), bool):
                raise RewindError(f"{where} has no valid '{key}'")
        for t in entry["patches"]:
            _check_template(where, t)
        entry.setdefault("origin", "fix")
        entry.setdefault("programs", [])
        entry.setdefault("inputs", [])
        entry.setdefault("inputSetsPassed", entry["validations"] * len(entry["inputs"]))
        entry.setdefault("rejections", 0)
        entry.setdefault("rejectedFor", [])
        for key in ("inputSetsPassed", "rejections"):
            if not isinstance(entry[key], int) or isinstance(entry[key], bool) or entry[key] < 0:
                raise RewindError(f"{where}: '{key}' must be a count >= 0, got {echo(repr(entry[key]))}")
        for key in ("programs", "inputs", "rejectedFor"):
            if not isinstance(entry[key], list) or not all(isinstance(v, str) for v in entry[key]):
                raise RewindError(f"{where}: '{key}' must be a list of names")
        return entry

    def save(self) -> None:
        """Write the file whole and swap it in: a reader sees the old file or the new one, never half of one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=self.path.name, suffix=".tmp",
                                         delete=False) as staged:
            staged.write(json.dumps({"format": FORMAT, "fixes": self.fixes}, indent=1))
        os.replace(staged.name, self.path)

    @contextlib.contextmanager
    def _exclusive(self):
        """Hold the file's lock: two repair sessions recording at once must not drop each other's fixes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    # -- suggesting ----------------------------------------------------------------------------------
    def suggest(self, finding: Finding, forensics: Forensics) -> Iterator[Candidate]:
        """Candidates for a finding, each once: the recorded fixes of its pattern that apply here and were never
        rejected, by their evidence; then the built-in recipes'; then, last, the kinds once rejected (a recorded
        fix that also validated, then a recipe's), so a rejection never ranks a kind above one that validated.
        A kind that was only ever rejected is no recorded fix: it comes back only as a recipe's candidate."""
        program = forensics.program
        pattern = finding.match.pattern.name if finding.match else None
        mine = [e for e in self.fixes if e["pattern"] == pattern]
        rejected = {_key(e["patches"]) for e in mine if e["rejections"]}
        recorded = sorted((e for e in mine if e["validations"]), key=_evidence)
        offered = chain(((_key(e["patches"]), _instantiate(e, finding, program)) for e in recorded),
                        ((_key(templates(m, finding, program)), m) for m in recipes.candidates(finding, forensics)))
        seen: set[str] = set()
        held: list[Candidate] = []
        for key, made in offered:
            if made is None or key in seen:
                continue
            seen.add(key)
            made = made.in_every_step(program)
            if key in rejected:
                held.append(made)
            else:
                yield made
        yield from held

    # -- recording -----------------------------------------------------------------------------------
    def record(self, finding: Finding, candidate: Candidate, program: Program, inputs: list[str]) -> dict:
        """Record a fix that passed every rule of validation on the input sets named `inputs` for this finding
        (again: one more validation of the same fix)."""
        with self._entry(finding, candidate, program) as entry:
            entry["validations"] += 1
            entry["inputSetsPassed"] += len(inputs)
            entry["inputs"] = inputs
            if program.name not in entry["programs"]:
                entry["programs"].append(program.name)
        return entry

    def reject(self, finding: Finding, candidate: Candidate, program: Program, rules: list[str]) -> dict:
        """Record that a fix was judged for this finding and rejected for breaking `rules` (validation's)."""
        with self._entry(finding, candidate, program) as entry:
            entry["rejections"] += 1
            entry["rejectedFor"] = list(dict.fromkeys(entry["rejectedFor"] + rules))
        return entry

    @contextlib.contextmanager
    def _entry(self, finding: Finding, candidate: Candidate, program: Program):
        """The entry of this fix for this finding's pattern (a new one when there is none), updated under the
        file's lock and saved."""
        if finding.match is None:
            raise RewindError("only a fix of a finding with a failure pattern can be recorded")
        patches = templates(candidate, finding, program)
        with self._exclusive():
            self.fixes = self._load()  # with what other sessions recorded since this one read the file
            entry = next((e for e in self.fixes if e["pattern"] == finding.match.pattern.name
                          and _key(e["patches"]) == _key(patches)), None)
            if entry is None:
                entry = {"pattern": finding.match.pattern.name, "name": candidate.name, "origin": candidate.origin,
                         "patches": patches, "validations": 0, "programs": [], "inputs": [], "inputSetsPassed": 0,
                         "rejections": 0, "rejectedFor": []}
                self.fixes.append(entry)
            yield entry
            self.save()


def templates(candidate: Candidate, finding: Finding, program: Program) -> list[dict]:
    """The candidate's patches relative to the finding's node, as JSON: in a training Program those of the
    finding's step (the fix applies them in every step); an edit of the Program by its kind and settings."""
    if candidate.edit is not None:
        return [{"op": "", "hops": None, "node": "", "kind": "program", "edit": candidate.edit.kind,
                 "settings": dict(candidate.edit.settings)}]
    hops = graph_hops(program, finding.node.index)
    out = []
    for p in candidate.patches:
        node = program.nodes[p.node]
        if node.step != finding.node.step:
            continue
        t = {"op": node.op, "hops": hops.get(p.node), "node": node.name, "kind": p.kind}
        if isinstance(p, PrecisionPatch):
            t["dtype"] = p.dtype
        elif isinstance(p, AttributePatch):
            t["attributes"] = p.to_dict()["attributes"]
        elif isinstance(p, FunctionPatch):
            source = candidate.sources[p.node]
            t.update(file=source.file, function=source.function, text=source.text)
        else:
            raise RewindError(f"a {p.kind} patch is an experiment, not a fix: it cannot be recorded")
        out.append(t)
    return sorted(out, key=lambda t: (t["hops"] is None, t["hops"] or 0, t["node"]))


def _instantiate(entry: dict, finding: Finding, program: Program) -> Candidate | None:
    """A recorded fix applied at this finding, or None where the graph around it has no such nodes (or the
    integrity check refuses its source: a recorded function is read before its module runs)."""
    if any(scan_source(t["text"], t["file"]) for t in entry["patches"] if t["kind"] == "function"):
        return None
    runs = (f"validated {entry['validations']} time(s), on {entry['inputSetsPassed']} input sets of "
            f"{', '.join(entry['programs'])}")
    if entry["rejections"]:
        runs += f"; rejected {entry['rejections']} time(s): {', '.join(entry['rejectedFor'])}"
    edits = [t for t in entry["patches"] if t["kind"] == "program"]
    if edits:
        try:
            edit = ProgramEdit.of(edits[0]["edit"], edits[0]["settings"])
        except RewindError:
            return None  # an edit this version does not know
        return Candidate(entry["name"], "learned", [], {}, runs, edit) if is_training(program) else None
    hops = graph_hops(program, finding.node.index)
    patches: list[Patch] = []
    sources: dict[int, FunctionSource] = {}
    for t in entry["patches"]:
        if t["hops"] is None:
            nodes = [n.index for n in program.nodes if n.name == t["node"] and n.op == t["op"]]
        else:
            nodes = [i for i, h in hops.items() if h == t["hops"] and program.nodes[i].op == t["op"]]
        if not nodes:
            return None
        for i in nodes:
            patches.append(_patch(t, program, i, sources))
    return Candidate(entry["name"], "learned", patches, sources, runs)


def _patch(t: dict, program: Program, node: int, sources: dict[int, FunctionSource]) -> Patch:
    if t["kind"] == "precision":
        return PrecisionPatch(node, t["dtype"])
    if t["kind"] == "attributes":
        return AttributePatch.of(program.nodes[node], t["attributes"])
    sources[node] = FunctionSource(t["file"], t["text"], t["function"])
    return FunctionPatch(node, function_from(sources[node]), f"{t['function']} (recorded)")


def _evidence(entry: dict) -> tuple:
    """Most validated first; then on the most input sets; then on the most programs."""
    return -entry["validations"], -entry["inputSetsPassed"], -len(entry["programs"])


TEMPLATE_FIELDS = {"precision": {"dtype": str}, "attributes": {"attributes": dict},
                   "function": {"file": str, "function": str, "text": str},
                   "program": {"edit": str, "settings": dict}}


def _check_template(where: str, t: object) -> None:
    """A recorded patch names a node by op and hops (or name) and says what it does, in fields of known types."""
    if not isinstance(t, dict) or t.get("kind") not in TEMPLATE_FIELDS:
        raise RewindError(f"{where} has a patch that is not a precision, attributes or function patch, nor an edit "
                          "of the program")
    fields = {"op": str, "node": str, **TEMPLATE_FIELDS[t["kind"]]}
    for key, kind in fields.items():
        if not isinstance(t.get(key), kind):
            raise RewindError(f"{where} has a {t['kind']} patch without a valid '{key}'")
    if t.get("hops") is not None and (not isinstance(t["hops"], int) or isinstance(t["hops"], bool)):
        raise RewindError(f"{where} has a patch whose 'hops' is not a whole number")


def _key(patches: list[dict]) -> str:
    """What makes two recorded fixes the same fix: where each patch goes and what it does."""
    return json.dumps([{k: v for k, v in t.items() if k != "file" and (k != "node" or t["hops"] is None)}
                       for t in patches], sort_keys=True)


def graph_hops(program: Program, node: int) -> dict[int, int]:
    """Signed distance of every node up (-) or downstream (+) of `node` in the graph; `node` itself is 0."""
    consumers: dict[str, list[int]] = {}
    for n in program.nodes:
        for name in n.input_names():
            consumers.setdefault(name, []).append(n.index)
    hops = {node: 0}
    for sign in (-1, 1):
        queue = deque([node])
        while queue:
            at = queue.popleft()
            here = program.nodes[at]
            if sign < 0:
                near = [program.values[v].producer for v in here.input_names()]
            else:
                near = [c for v in here.outputs for c in consumers.get(v, [])]
            for other in near:
                if other is not None and other not in hops:
                    hops[other] = hops[at] + sign
                    queue.append(other)
    return hops
