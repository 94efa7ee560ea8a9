"""The DebugSession's numerics and experiments (rewind/session.py): forensics against the reference, the per-node
comparison, ablation, patches on branches measured and undone, the repair loop. Each runs the request handler the
DAP server runs (dap_server/forensics.py, numerics.py, experiments.py, repair.py) or, for the whole
investigation, what `rewind forensics` runs (provenance/investigation.py), and answers in the console's words."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from checkpoint.timeline import Timeline
from dap_server import experiments, forensics, numerics, repair
from dap_server.console_experiments import (describe_comparison, describe_listing, describe_measurement,
                                            describe_suggestions)
from dap_server.console_numerics import (describe_ablation, describe_divergence, describe_reference,
                                         describe_reference_table)
from hardware.errors import RewindError, echo, os_reason
from hardware.jsonable import json_safe
from hardware.program import Program
from provenance.ablation import DEFAULT_MAX_TRIALS
from provenance.experiments import ORIGINAL
from provenance.forensics import Forensics
from provenance.investigation import investigate, render
from provenance.repair import DEFAULT_ATTEMPTS, DEFAULT_SECONDS
from provenance.repair_cli import render as render_repair
from provenance.report_html import gather
from rewind import arguments as checks
from rewind.displays import Answer, ChartAnswer, ForensicsAnswer, errors_by_tick

if TYPE_CHECKING:
    from hardware.session import LaunchOptions, Session

T = TypeVar("T")
DEFAULT_BRANCH = experiments.DEFAULT_BRANCH
ERRORS = "errors against the reference by tick (x tolerance; above 1 is beyond it)"


@dataclass
class _AgainstReference:
    """The Session as an investigation sees it, with its forensics against another reference than the session's
    own (the one `rewind.debug(..., reference=...)` chose, which breakpoints and experiments use)."""

    session: "Session"
    forensics: Forensics

    @property
    def options(self) -> "LaunchOptions | None":
        return self.session.options

    @property
    def tl(self) -> Timeline:
        return self.session.tl

    @property
    def program(self) -> Program:
        return self.session.program


class AnalysisCommands:
    """Supplied by DebugSession: the engine's Session, the handlers' runner and the checks of arguments."""

    session: "Session"
    _references: dict[str, Forensics]
    _ask: Callable[..., Any]
    _ask_session: Callable[[Callable[[], T]], T]

    # -- forensics --------------------------------------------------------------------------------------
    def forensics(self, reference: str | None = None, ablate: bool = True,
                  max_trials: int = DEFAULT_MAX_TRIALS) -> ForensicsAnswer:
        """The whole investigation, as `rewind forensics` runs it: where the first NaN/Inf that matters was born,
        where the pass left its reference and where upstream that error came from, the failure pattern and its
        fix, and (ablate=True) which nodes at higher precision bring the outputs back. `reference`: compare
        against this instead of the session's reference (torch:cpu:float64, a trace, or saved values). In
        Jupyter: the report with its error-growth chart; `save_html(path)` writes it as a page to send."""
        ablating, trials = checks.flag("ablate", ablate), checks.whole("max_trials", max_trials)
        if trials < 1:
            raise RewindError(f"max_trials must be 1 or more, got {trials}")

        def investigation():
            view = self._against(reference)
            found = investigate(view, ablate=ablating, max_trials=trials)
            return found, gather(view, found)

        found, evidence = self._ask_session(investigation)
        return ForensicsAnswer(render(found, evidence.sources), json_safe(found.to_dict()), evidence)

    def compare(self, *branches: str, start: int = 0, count: int | None = None) -> ChartAnswer:
        """Every node's error against the reference, introduced by the node or inherited from its inputs; with
        branch names, those branches side by side against the original."""
        if branches:
            body = self._ask(experiments.compare_branches, experiments.CompareBranchesArguments,
                             branches=list(branches))
            series = {ORIGINAL: errors_by_tick(body["nodes"], lambda n: n["original"]["error"])}
            series.update({b: errors_by_tick(body["nodes"], lambda n, b=b: (n["branches"].get(b) or {}).get("error"))
                           for b in branches})
            return ChartAnswer(describe_comparison(body), body, series, f"branches: {ERRORS}")
        body = self._ask(forensics.compare_with_reference, forensics.CompareWithReferenceArguments, start=start,
                         count=count, introduced=True)
        series = {"observed": errors_by_tick(body["rows"], lambda r: r["error"]),
                  "introduced alone": errors_by_tick(body["rows"], lambda r: r["introduced"]["error"])}
        return ChartAnswer(describe_reference_table(body), body, series, ERRORS)

    def first_divergence(self, start: int = 0) -> Answer:
        """The first node that leaves the reference, why, where upstream its error came from, how it grows."""
        body = self._ask(forensics.first_divergence, forensics.FirstDivergenceArguments, start=start)
        return Answer(describe_divergence(body), body)

    def reference(self, name: str) -> Answer:
        """A name's value in the reference (its stats), and this pass's against it at the position."""
        body = self._ask(numerics.reference_value, numerics.ReferenceValueArguments, name=name)
        return Answer(describe_reference(name, body), body)

    def ablate(self, *nodes: str, search: bool = False, dtype: str | None = None,
               max_trials: int = DEFAULT_MAX_TRIALS) -> Answer:
        """Run nodes (names, ops or module paths) at higher precision and measure the outputs; search=True finds a
        small set that fixes them. The recorded pass stays as it was."""
        if bool(nodes) == bool(search):
            raise RewindError("ablate takes node names, or search=True (not both)")
        body = self._ask(forensics.ablate_precision, forensics.AblatePrecisionArguments,
                         nodes=list(nodes) or None, search=search, dtype=dtype, maxTrials=max_trials)
        return Answer(describe_ablation(body), body)

    def compare_with(self, reference: str, *, candidate: str | None = None, function: str | None = None,
                     inputs: str | None = None, validate: bool = False) -> Answer:
        """This session's model file (or `candidate`, or its `function`) against a trusted implementation, down to
        the first line that departs from what the reference implies (docs/compare.md): `reference` is model.py,
        model.py@HEAD~1, ref.py:function or a driver such as torch:cpu:float64. validate=True runs the function
        on the coverage suite instead."""
        from dap_server import compare as comparing  # deferred: only this method needs the candidates' code
        from provenance.candidates.report import render as render_comparison, render_validation

        given = checks.path_text("candidate", candidate) if candidate is not None else self.session.options.program
        fields = {"candidate": given, "against": checks.path_text("reference", reference), "function": function,
                  "inputs": inputs}
        handler = comparing.validate_candidate if checks.flag("validate", validate) else comparing.compare_candidate
        body = self._ask(handler, comparing.CompareCandidateArguments, **fields)
        return Answer((render_validation if validate else render_comparison)(body), body)

    def _against(self, reference: str | None):
        """The session itself, or a view of it whose forensics use `reference` (built once per reference)."""
        if reference is None:
            return self.session
        given = checks.path_text("reference", reference)
        spec = given if given.startswith("torch:") else os.path.abspath(given)
        if spec == self.session.forensics.spec:
            return self.session
        if spec not in self._references:
            self._references[spec] = Forensics(self.session, spec)
        return _AgainstReference(self.session, self._references[spec])

    # -- experiments ------------------------------------------------------------------------------------
    def patch(self, node: str | None = None, *, precision: str | None = None, function: str | None = None,
              entry: str | None = None, attributes: dict | None = None, edit: tuple | None = None,
              optimizer: dict | None = None, name: str | None = None, branch: str = DEFAULT_BRANCH,
              from_step: int | None = None) -> Answer:
        """Patch the frozen pass on a branch and install it (the position stays): run `node` (a name, an op or a
        module path) at `precision` ("float64"), replace its op by `function` (Python source defining it;
        `entry` names it), change its `attributes` ({"eps": 1e-3}), set one element of a value
        (edit=("div", [0, 1, 2], 0.0)), or change a training step's `optimizer` ({"lr": 0.01}, from training
        step `from_step` on). `measure()` says what it changed; `undo()` brings the recorded pass back."""
        change = _edit(edit) if edit is not None else None
        chosen = {"precision": precision, "function": function, "attributes": attributes, "edit": change,
                  "optimizer": optimizer}
        given = [k for k, v in chosen.items() if v is not None]
        if len(given) != 1:
            raise RewindError("patch takes exactly one of precision, function, attributes, edit or optimizer")
        label = name or _patch_name(node, given[0], chosen[given[0]], entry)
        body = self._ask(experiments.add_patch, experiments.AddPatchArguments, name=label, branch=branch, node=node,
                         entry=entry, fromStep=from_step, **{given[0]: chosen[given[0]]})
        return Answer(f"added patch '{label}' to branch '{body['active']}' (installed)\n{describe_listing(body)}",
                      body)

    def unpatch(self, name: str, branch: str = DEFAULT_BRANCH) -> Answer:
        """Remove a patch from a branch."""
        body = self._ask(experiments.remove_patch, experiments.RemovePatchArguments, name=name, branch=branch)
        return Answer(f"removed patch '{name}'\n{describe_listing(body)}", body)

    def patches(self) -> Answer:
        """The branches and their patches (* marks the installed one)."""
        body = self._ask(experiments.list_patches, experiments.ListPatchesArguments)
        return Answer(describe_listing(body), body)

    def branch(self, name: str) -> Answer:
        """Install a branch (`undo()` installs the recorded pass)."""
        body = self._ask(experiments.restore_branch, experiments.RestoreBranchArguments, branch=name)
        return Answer(f"installed branch '{body['active']}'\n{describe_listing(body)}", body)

    def undo(self) -> Answer:
        """The recorded pass back, bit for bit."""
        body = self._ask(experiments.restore_branch, experiments.RestoreBranchArguments, branch=ORIGINAL)
        return Answer(f"the recorded pass is back ({ORIGINAL} installed)\n{describe_listing(body)}", body)

    def measure(self, branch: str | None = None, nodes: bool = True) -> ChartAnswer:
        """A branch's outputs against the reference and the original, and (nodes=True) every node from the patch
        on; in Jupyter, the branch's and the original's errors drawn by tick."""
        body = self._ask(experiments.measure_branch, experiments.MeasureBranchArguments, branch=branch, nodes=nodes)
        series = {ORIGINAL: errors_by_tick(body["nodes"], lambda n: n["originalError"]),
                  body["branch"]: errors_by_tick(body["nodes"], lambda n: n["error"])}
        return ChartAnswer(describe_measurement(body), body, series, f"branch {body['branch']}: {ERRORS}")

    def suggest(self, limit: int = 3) -> Answer:
        """The knowledge base's candidate fixes for this pass's findings (not validated yet: `repair` does)."""
        body = self._ask(repair.suggest_fixes, repair.SuggestFixesArguments, limit=limit)
        return Answer(describe_suggestions(body), body)

    def repair(self, *fixes: str, suggest: bool | None = None, max_attempts: int = DEFAULT_ATTEMPTS,
               time_limit: float = DEFAULT_SECONDS) -> Answer:
        """The repair loop, as `rewind repair` runs it: each fix file (Python defining PATCHES) validated on the
        example inputs and generated ones; then, or without fixes, the knowledge base's suggestions."""
        given = [repair.FixArguments(text=_read(f), name=Path(f).name) for f in fixes]
        body = self._ask(repair.repair, repair.RepairArguments, fixes=given, suggest=suggest,
                         maxAttempts=max_attempts, timeLimit=time_limit)
        return Answer(render_repair(body), body)


def _edit(edit: Any) -> dict:
    """edit=(value, index, number): one element of a node's output set to a number."""
    if not (isinstance(edit, (tuple, list)) and len(edit) == 3 and isinstance(edit[1], (tuple, list))):
        raise RewindError("edit is (value, index, number), e.g. edit=('div', [0, 1, 2], 0.0)")
    value, index, number = edit
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise RewindError(f"an edit sets a number, got {echo(repr(number))}")
    return {"value": value, "index": [checks.whole("an edit's index", i) for i in index], "set": float(number)}


def _patch_name(node: str | None, kind: str, change: Any, entry: str | None) -> str:
    """A patch's default name, as the console gives it: `softmax-float64`, `div[0,1,2]`, `optimizer-lr`."""
    if kind == "edit":
        return f"{change['value']}[{','.join(map(str, change['index']))}]"
    what = {"precision": str(change), "function": entry or "function"}.get(kind) or "-".join(map(str, change))
    return f"{'optimizer' if kind == 'optimizer' else node}-{what}"


def _read(file: Any) -> str:
    path = checks.path_text("a fix file", file)
    try:
        return Path(path).read_text()
    except (OSError, ValueError) as exc:
        raise RewindError(f"cannot read {file}: {os_reason(exc)}") from None
