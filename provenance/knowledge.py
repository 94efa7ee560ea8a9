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
        return saved["fixes"]

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
        """Candidates for a finding: the recorded fixes of its pattern that apply here, then the built-in
        recipes' (each once)."""
        program = forensics.program
        seen: set[str] = set()
        pattern = finding.match.pattern.name if finding.match else None
        recorded = sorted((e for e in self.fixes if e["pattern"] == pattern), key=lambda e: -e["validations"])
        for entry in recorded:
            made = _instantiate(entry, finding, program)
            if made is not None and _key(entry["patches"]) not in seen:
                seen.add(_key(entry["patches"]))
                yield made
        for made in recipes.candidates(finding, forensics):
            key = _key(templates(made, finding, program))
            if key not in seen:
                seen.add(key)
                yield made

    # -- recording -----------------------------------------------------------------------------------
    def record(self, finding: Finding, candidate: Candidate, program: Program, inputs: list[str]) -> dict:
        """Record a fix that validated for this finding (again: one more validation of the same fix)."""
        if finding.match is None:
            raise RewindError("only a fix of a finding with a failure pattern can be recorded")
        patches = templates(candidate, finding, program)
        with self._exclusive():
            self.fixes = self._load()  # with what other sessions recorded since this one read the file
            entry = next((e for e in self.fixes if e["pattern"] == finding.match.pattern.name
                          and _key(e["patches"]) == _key(patches)), None)
            if entry is None:
                entry = {"pattern": finding.match.pattern.name, "name": candidate.name, "origin": candidate.origin,
                         "patches": patches, "validations": 0, "programs": [], "inputs": inputs}
                self.fixes.append(entry)
            entry["validations"] += 1
            if program.name not in entry["programs"]:
                entry["programs"].append(program.name)
            self.save()
        return entry


def templates(candidate: Candidate, finding: Finding, program: Program) -> list[dict]:
    """The candidate's patches relative to the finding's node, as JSON."""
    hops = graph_hops(program, finding.node.index)
    out = []
    for p in candidate.patches:
        node = program.nodes[p.node]
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
    runs = f"validated {entry['validations']} time(s), on {', '.join(entry['programs'])}"
    return Candidate(entry["name"], "learned", patches, sources, runs)


def _patch(t: dict, program: Program, node: int, sources: dict[int, FunctionSource]) -> Patch:
    if t["kind"] == "precision":
        return PrecisionPatch(node, t["dtype"])
    if t["kind"] == "attributes":
        return AttributePatch.of(program.nodes[node], t["attributes"])
    sources[node] = FunctionSource(t["file"], t["text"], t["function"])
    return FunctionPatch(node, function_from(sources[node]), f"{t['function']} (recorded)")


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
