"""Experiments: named branches of named patches on the frozen pass, measured, compared and undone.

A branch is a set of named patches (checkpoint/branch.py: another precision, a function in place of
an op, other attributes, a value edit). At most one branch is installed on the Timeline at a time:
installing one sets the recorded future aside from its first patched step and re-executes from
there (from the checkpoints and retained values: no rebuild, no rerun from the start); restoring
the original brings the recorded pass back bit for bit (its values are recomputed on demand and
checked against their recorded digests). The position stays where the user has it.

Measuring a branch compares its outputs with the reference pass and with the original (unpatched)
pass, and every node from the patch point on with the reference, next to the original's error and
the time each node took in both; a training Program's, its loss at each step on the branch and in the
original (a patch from step k on leaves the losses up to step k as they were).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from checkpoint.branch import Branch, Patch
from checkpoint.timeline import Timeline
from hardware.driver import cast, to_host
from hardware.errors import RewindError
from hardware.jsonable import json_safe
from hardware.program import Node, Program
from provenance.compare import compare, error
from provenance.forensics import WithForensics
from provenance.steps import is_training

ORIGINAL = "original"
ORIGINALS_KEPT = 8  # measurements of the original pass remembered (each holds a copy of its outputs)
_BRANCH_NAME = re.compile(r"^[\w.\-]{1,64}$")


@dataclass(frozen=True)
class NamedPatch:
    """A patch as the user named it: one change, applied to each node it names."""

    name: str
    patches: tuple[Patch, ...]

    def to_dict(self, program: Program, node_tick: list[int]) -> dict:
        nodes = [program.nodes[p.node] for p in self.patches]
        return {"name": self.name, **self.patches[0].to_dict(),
                "nodes": [{"node": n.name, "op": n.op, "tick": node_tick[n.index],
                           "source": str(n.loc) if n.loc else None} for n in nodes]}


def nodes_named(program: Program, spec: str) -> list[Node]:
    """The nodes a spec names: a node name, an op (aten.exp) or a module path (blocks.3.attn)."""
    hits = program.find_nodes(spec)
    if not hits:
        raise RewindError(f"no node, op or module path '{spec}' in the program")
    return [program.nodes[i] for i in hits]


class Experiments:
    """The named branches of one Session's Timeline, and which of them is installed."""

    def __init__(self, session: WithForensics):
        self.session = session
        self.timeline = session.tl
        self.program = session.program
        self.branches: dict[str, dict[str, NamedPatch]] = {}
        self.active = ORIGINAL
        self._installed: Branch | None = None
        self._originals: dict[tuple[int, str], OriginalPass] = {}  # by the original's recorded writes from a tick

    # -- patches ------------------------------------------------------------------------------------
    def add(self, branch: str, patch: NamedPatch) -> None:
        """Add a named patch to `branch` (created on first use) and install that branch."""
        if branch == ORIGINAL or not _BRANCH_NAME.match(branch):
            raise RewindError(f"'{branch}' cannot name a branch: use letters, digits, '.', '-' or '_' "
                              f"(and not '{ORIGINAL}', the recorded pass)")
        patches = self.branches.get(branch, {})
        if patch.name in patches:
            raise RewindError(f"branch '{branch}' already has a patch named '{patch.name}': remove it first")
        taken = {p.node: named.name for named in patches.values() for p in named.patches}
        for p in patch.patches:
            if p.node in taken:
                node = self.program.nodes[p.node]
                raise RewindError(f"{node.describe()} is already patched by '{taken[p.node]}' in branch '{branch}'")
        was, position = self.active, self.timeline.position
        self.branches[branch] = {**patches, patch.name: patch}
        try:
            self._reinstall(branch)
        except RewindError:  # the patch cannot run up to the position: the branch stays as it was
            self.branches[branch] = patches
            if not patches:
                del self.branches[branch]
            self._reinstall(was, position)
            raise

    def remove(self, branch: str, name: str) -> None:
        """Remove a patch; a branch left without patches is gone (the original is installed if it was)."""
        patches = self._branch(branch)
        if name not in patches:
            raise RewindError(f"branch '{branch}' has no patch named '{name}' (its patches: {', '.join(patches)})")
        del patches[name]
        if not patches:
            del self.branches[branch]
        if self.active == branch:
            self._reinstall(branch if patches else ORIGINAL)

    def listing(self) -> dict:
        tl = self.timeline
        return {"active": self.active,
                "branches": [{"name": name, "tick": self._tick(name),
                              "patches": [p.to_dict(self.program, tl.node_tick) for p in patches.values()]}
                             for name, patches in self.branches.items()]}

    def restore(self, branch: str = ORIGINAL) -> None:
        """Install `branch`; the original by default: undo, the recorded pass back bit for bit."""
        if branch != ORIGINAL:
            self._branch(branch)
        self._install(branch)

    # -- measuring ----------------------------------------------------------------------------------
    def measure(self, branch: str, nodes: bool = True) -> dict:
        """Install `branch`, run it to the end and measure it against the reference and the original: its
        outputs, and (`nodes`) every node from the patch point on."""
        f = self.session.forensics
        tick = self._tick(branch)
        original = self._original_from(tick, nodes)
        self._install(branch)
        tl = self.timeline
        position = tl.position
        tl.seek(tl.end)  # executes the branch (the Timeline times each step)
        tl.seek(position)
        rows = [self._row(t, original.rows[t]) for t in range(tick, tl.end) if t in original.rows] if nodes else []
        mine = self._outputs_now()
        now = zip(self.program.outputs, mine, f.outputs(), original.outputs, original.reference)
        outputs = [{"value": name, "reference": ref.to_dict(), "original": self._against(name, ours, theirs),
                    "originalReference": theirs_ref} for name, ours, ref, theirs, theirs_ref in now]
        curve = {"lossCurve": self._loss_curve(mine, original.outputs)} if is_training(self.program) else {}
        return json_safe({"branch": branch, "tick": tick, "patches": self.listing_of(branch), "outputs": outputs,
                          **curve, "nodes": rows, "seconds": _total(tl, tick, tl.seconds),
                          "originalSeconds": _total(tl, tick, original.seconds)})

    def _loss_curve(self, mine: list[torch.Tensor], original: list[torch.Tensor]) -> list[dict]:
        """A training Program's loss at each step, on the branch and in the original pass."""
        at = {name: i for i, name in enumerate(self.program.outputs)}
        return [{"step": k, "original": float(original[at[loss]]), "patched": float(mine[at[loss]])}
                for k, loss in enumerate(self.program.losses)]

    def compare(self, branches: list[str]) -> dict:
        """Measure each branch; side by side: the outputs' errors and each node's error and time."""
        if len(set(branches)) != len(branches) or not branches:
            raise RewindError("name each branch to compare once (at least one)")
        was = self.active
        measured = {name: self.measure(name) for name in branches}
        self._install(was)
        return {"branches": branches, "active": self.active, "outputs": _outputs_side_by_side(measured),
                "nodes": _nodes_side_by_side(measured), "seconds": {b: m["seconds"] for b, m in measured.items()}}

    def listing_of(self, branch: str) -> list[dict]:
        return [p.to_dict(self.program, self.timeline.node_tick) for p in self._branch(branch).values()]

    # -- installing ---------------------------------------------------------------------------------
    def _branch(self, name: str) -> dict[str, NamedPatch]:
        if name not in self.branches:
            raise RewindError(f"no branch '{name}' (branches: {', '.join([ORIGINAL, *self.branches])})")
        return self.branches[name]

    def _tick(self, branch: str) -> int:
        return min(self.timeline.node_tick[p.node] for named in self._branch(branch).values() for p in named.patches)

    def _install(self, branch: str) -> None:
        if branch != self.active:
            self._reinstall(branch)

    def _reinstall(self, branch: str, position: int | None = None) -> None:
        """Take the installed branch off and install `branch`, keeping the position (or going to `position`)."""
        tl = self.timeline
        position = tl.position if position is None else position
        if self._installed is not None:
            tl.unbranch(self._installed)
            self._installed, self.active = None, ORIGINAL
        if branch != ORIGINAL:
            self._installed = tl.branch(p for named in self.branches[branch].values() for p in named.patches)
            self.active = branch
        tl.seek(min(position, tl.end))

    # -- the original pass, remembered by what it recorded -------------------------------------------
    def _original_from(self, tick: int, nodes: bool) -> "OriginalPass":
        """The original's outputs, time and (`nodes`) each measurable step's error from `tick` on. Measured once
        (with the original installed) for as long as the original's recorded writes stay the same."""
        key = (tick, self._fingerprint(tick))
        known = self._originals.get(key)
        if known is None or (nodes and known.rows is None):
            self._install(ORIGINAL)
            tl, f = self.timeline, self.session.forensics
            f.record_to_end()
            key = (tick, self._fingerprint(tick))
            rows = {t: {"originalError": self._error_at(t)[1], "originalSeconds": tl.seconds.get(t)}
                    for t in range(tick, tl.end) if self._measurable(t)} if nodes else None
            self._originals[key] = OriginalPass(rows, dict(tl.seconds), self._outputs_now(),
                                                [c.to_dict() for c in f.outputs()])
            while len(self._originals) > ORIGINALS_KEPT:
                del self._originals[next(iter(self._originals))]
        return self._originals[key]

    def _fingerprint(self, tick: int) -> str:
        """A digest of the original's write records from `tick` on, wherever they are: in the log, or set
        aside by the installed branch."""
        log = self.timeline.log.tail(tick)
        b = self._installed
        if b is not None:
            mine = log["tick"] < b.tick
            theirs = b.log["tick"] >= tick
            log = {k: np.concatenate([v[mine], b.log[k][theirs]]) for k, v in log.items()}
        h = hashlib.blake2b(digest_size=16)
        for column in ("tick", "value", "digest"):
            h.update(log[column].tobytes())
        return h.hexdigest()

    def _outputs_now(self) -> list[torch.Tensor]:
        tl = self.timeline
        return [to_host(tl.driver, cast(tl.driver, tl.value(n, tl.end), self.program.values[n].dtype))
                for n in self.program.outputs]

    # -- rows ---------------------------------------------------------------------------------------
    def _measurable(self, tick: int) -> bool:
        node = self.timeline.node_at(tick)
        return node is not None and bool(self.session.forensics.floating_outputs(node))

    def _row(self, tick: int, original: dict) -> dict:
        tl = self.timeline
        node = tl.node_at(tick)
        value, worst, max_abs = self._error_at(tick)
        patch = next((named.name for named in self.branches.get(self.active, {}).values()
                      if any(p.node == node.index for p in named.patches)), None)
        return {"tick": tick, "node": node.name, "op": node.op, "source": str(node.loc) if node.loc else None,
                "patch": patch, "value": value, "error": worst, "maxAbs": max_abs, "within": worst <= 1.0,
                "seconds": tl.seconds.get(tick), **original}

    def _error_at(self, tick: int) -> tuple[str, float, float]:
        """The worst floating output of the node at `tick` against the reference: (value, error, max |diff|)."""
        f = self.session.forensics
        errors = []
        for name in f.floating_outputs(self.timeline.node_at(tick)):
            rtol, atol = f.tolerance.for_dtype(f.precision[name])
            errors.append((name, *error(name, f.test_value(name, tick + 1), f.reference.value(name), rtol, atol,
                                        f.scale(name))))
        return max(errors, key=lambda e: e[1])

    def _against(self, name: str, ours: torch.Tensor, theirs: torch.Tensor) -> dict:
        f = self.session.forensics
        rtol, atol = f.tolerance.for_dtype(f.precision[name])
        return compare(name, self.program.values[name].dtype, ours, theirs, rtol, atol).to_dict()


class WithExperiments(WithForensics, Protocol):
    """A handed Session that also keeps the experiments (named branches) of its pass."""

    @property
    def experiments(self) -> Experiments: ...


def _outputs_side_by_side(measured: dict[str, dict]) -> list[dict]:
    first = next(iter(measured.values()))["outputs"]
    return [{"value": out["value"], "original": out["originalReference"],
             "branches": {b: {k: m["outputs"][i][k] for k in ("reference", "original")} for b, m in measured.items()}}
            for i, out in enumerate(first)]


def _nodes_side_by_side(measured: dict[str, dict]) -> list[dict]:
    """One row per node any branch measured: the original's error and time, then each branch's."""
    rows: dict[int, dict] = {}
    for b, m in measured.items():
        for row in m["nodes"]:
            entry = rows.setdefault(row["tick"], {k: row[k] for k in ("tick", "node", "op", "source")} | {
                "original": {"error": row["originalError"], "seconds": row["originalSeconds"]}, "branches": {}})
            entry["branches"][b] = {"error": row["error"], "seconds": row["seconds"], "patch": row["patch"]}
    return [rows[t] for t in sorted(rows)]


@dataclass
class OriginalPass:
    rows: dict[int, dict] | None  # tick -> the original's error and seconds there (None: not measured)
    seconds: dict[int, float]  # tick -> how long its step took
    outputs: list[torch.Tensor]  # on the host, in the declared dtypes
    reference: list[dict]  # the outputs against the reference


def _total(tl: Timeline, tick: int, seconds: dict[int, float]) -> float:
    """How long the steps from `tick` to the end took."""
    return sum(seconds.get(t, 0.0) for t in range(tick, tl.end))
