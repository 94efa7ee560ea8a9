"""The repair loop: forensics -> candidate fix -> integrity -> validation -> verdict, and again.

A deterministic state machine an agent (or a person) drives with fixes, or lets the knowledge
base drive with its suggestions:

1. forensics: run the pass, find the first NaN/Inf and the first divergence, classify them;
2. candidate: the next fix: the fixer's files in the order given, then (when asked) the knowledge
   base's suggestions for each finding, earliest finding first;
3. integrity: read every module the fix's functions come from (provenance/integrity.py);
4. validation: the engine runs the patched pass on the example inputs and on generated ones and
   judges it by every rule (provenance/validation.py: no NaN/Inf masked rather than prevented,
   outputs certified against the reference, dtypes kept), auditing every call the fix makes
   while it runs;
5. verdict: the first fix that validates ends the loop and is recorded in the knowledge base
   (pattern -> fix); a rejected one is recorded as rejected (its kind is never ranked up again)
   and followed by the next candidate, within bounded attempts and time.

Every verdict carries its evidence as JSON: which inputs, which errors, which refused calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from hardware.errors import RewindError
from hardware.jsonable import json_safe
from provenance.experiments import WithExperiments
from provenance.fixes import Candidate, fix_from_text
from provenance.forensics import Finding
from provenance.inputs import InputPlan
from provenance.integrity import REFUSED, CallAudit, Violation, scan_source
from provenance.investigation import Investigation, investigate
from provenance.knowledge import KnowledgeBase
from provenance.validation import Validator

DEFAULT_ATTEMPTS = 8
DEFAULT_SECONDS = 600.0


@dataclass(frozen=True)
class RepairLimits:
    attempts: int = DEFAULT_ATTEMPTS
    seconds: float = DEFAULT_SECONDS

    def __post_init__(self) -> None:
        if self.attempts < 1 or not self.seconds > 0:
            raise RewindError("the repair loop needs at least 1 attempt and a time limit above 0 seconds")


@dataclass(frozen=True)
class FixText:
    """A fixer's fix file (provenance/fixes.py), as text."""

    text: str
    file: str  # the file its code runs as: its path, or a made-up name for text sent without one
    name: str = ""  # what the verdict calls it (default: the file's name)

    @property
    def label(self) -> str:
        return self.name or Path(self.file).name


@dataclass
class Attempt:
    candidate: dict
    violations: list[Violation] = field(default_factory=list)
    validation: dict | None = None
    verdict: str = "rejected"
    reason: str = ""
    fix: Candidate | None = None  # the candidate as loaded (a fix file's patches)
    rules: list[str] = field(default_factory=list)  # the rules a rejected fix broke (none: it was not judged)

    def to_dict(self) -> dict:
        return {"candidate": self.candidate, "verdict": self.verdict, "reason": self.reason,
                "integrity": {"passed": not self.violations, "violations": [v.to_dict() for v in self.violations]},
                "validation": self.validation}


class RepairLoop:
    def __init__(self, session: WithExperiments, knowledge: KnowledgeBase, limits: RepairLimits = RepairLimits(),
                 plan: InputPlan = InputPlan()):
        self.session, self.knowledge, self.limits, self.plan = session, knowledge, limits, plan
        self.transitions: list[dict] = []
        self.attempts: list[Attempt] = []

    def run(self, fixes: list[FixText], suggest: bool) -> dict:
        """The loop on the recorded pass (an installed experiment branch is taken off first); the verdict."""
        started = time.monotonic()
        deadline = started + self.limits.seconds
        self.session.experiments.restore()
        found = investigate(self.session, ablate=False, origin=False, drift=False)
        findings = findings_of(found)
        self._enter("forensics", problem=found.problem, findings=[f.node.name for f in findings])
        report = {"program": found.program, "driver": found.driver, "reference": found.reference,
                  "findings": [f.to_dict() for f in findings], "outputs": [c.to_dict() for c in found.outputs],
                  "fix": None, "knowledge": {"path": str(self.knowledge.path), "recorded": None, "rejected": []}}
        if not fixes and not found.problem:
            return self._verdict(report, "clean", "the pass has no NaN/Inf and matches its reference", started)
        validator = Validator(self.session, self.plan)
        report["inputs"] = [s.to_dict() for s in validator.sets] + [{"skipped": why} for why in validator.skipped]
        verdict, why = "no-candidate", "no fix was given and the knowledge base has none for these findings"
        progress = self.session.forensics.progress("repair: validating candidate fixes")
        for finding, candidate in self._candidates(fixes, findings, suggest):
            if len(self.attempts) >= self.limits.attempts or time.monotonic() > deadline:
                verdict, why = "exhausted", self._exhausted(deadline)
                break
            progress(len(self.attempts), self.limits.attempts)
            attempt = self._attempt(candidate, validator, deadline)
            self._record_rejection(finding, attempt, report["knowledge"])
            if attempt.verdict == "validated":
                report["fix"] = attempt.candidate
                report["knowledge"]["recorded"] = self._record(finding, attempt.fix, validator)
                verdict, why = "validated", attempt.reason
                break
            verdict, why = "rejected", f"no candidate validated ({len(self.attempts)} tried)"
        return self._verdict(report, verdict, why, started)

    # -- the states -----------------------------------------------------------------------------------
    def _candidates(self, fixes: list[FixText], findings: list[Finding],
                    suggest: bool) -> Iterator[tuple[Finding | None, Candidate | FixText]]:
        """The fixer's fixes (for the first finding), then the knowledge base's for each finding."""
        first = findings[0] if findings else None
        for fix in fixes:
            yield first, fix
        forensics = self.session.forensics
        for finding in findings if suggest else []:
            for candidate in self.knowledge.suggest(finding, forensics):
                yield finding, candidate

    def _attempt(self, given: Candidate | FixText, validator: Validator, deadline: float) -> Attempt:
        number = len(self.attempts) + 1
        texts = {given.file: given.text} if isinstance(given, FixText) else {
            s.file: s.text for s in given.sources.values()}
        audit = CallAudit(texts, self.session.program.source_files)
        attempt = Attempt({"name": given.label if isinstance(given, FixText) else given.name})
        self.attempts.append(attempt)
        self._enter("candidate", attempt=number, name=attempt.candidate["name"])
        candidate = self._integrity(attempt, given, texts, audit)
        self._enter("integrity", attempt=number, passed=not attempt.violations)
        if candidate is not None:
            self._validate(attempt, candidate, validator, audit, deadline)
            self._enter("validation", attempt=number, passed=attempt.verdict == "validated",
                        failed=attempt.validation["failed"])
        self._enter("verdict", attempt=number, verdict=attempt.verdict, reason=attempt.reason)
        return attempt

    def _integrity(self, attempt: Attempt, given: Candidate | FixText, texts: dict[str, str],
                   audit: CallAudit) -> Candidate | None:
        """Read the fix's sources, then load a fix file under the audit: the candidate, or None (refused)."""
        attempt.violations = [v for file, text in texts.items() for v in scan_source(text, file)]
        if not attempt.violations and isinstance(given, FixText):
            try:
                given = fix_from_text(given.text, given.file, self.session.program, audit, given.label)
            except RewindError as exc:
                attempt.violations = list(audit.violations)
                attempt.reason = str(exc)
        if attempt.violations:
            attempt.reason = REFUSED
        return None if attempt.reason else given

    def _validate(self, attempt: Attempt, candidate: Candidate, validator: Validator, audit: CallAudit,
                  deadline: float) -> None:
        attempt.candidate, attempt.fix = candidate.to_dict(self.session.program), candidate
        validation = validator.validate(candidate.guarded(audit), deadline, candidate.edit)
        attempt.violations = list(audit.violations)
        attempt.validation = validation.to_dict()
        if attempt.violations:
            attempt.reason = REFUSED
            attempt.rules = [REFUSED]
        elif validation.passed:
            attempt.verdict = "validated"
            attempt.reason = (f"outputs within tolerance of the reference on all {len(validation.checks)} input "
                              "sets, and no NaN/Inf born that the reference does not absorb")
        else:
            attempt.reason = validation.reason
            attempt.rules = [] if validation.stopped is not None else validation.rules

    def _record(self, finding: Finding | None, candidate: Candidate, validator: Validator) -> dict | None:
        if finding is None or finding.match is None:
            return None
        entry = self.knowledge.record(finding, candidate, self.session.program, [s.name for s in validator.sets])
        return {"pattern": entry["pattern"], "name": entry["name"], "validations": entry["validations"],
                "inputSetsPassed": entry["inputSetsPassed"], "rejections": entry["rejections"]}

    def _record_rejection(self, finding: Finding | None, attempt: Attempt, knowledge: dict) -> None:
        """A fix judged and rejected is recorded as such, so the knowledge base never ranks its kind up again."""
        if finding is None or finding.match is None or attempt.fix is None or not attempt.rules:
            return
        entry = self.knowledge.reject(finding, attempt.fix, self.session.program, attempt.rules)
        knowledge["rejected"].append({"pattern": entry["pattern"], "name": entry["name"],
                                      "rejections": entry["rejections"], "rejectedFor": entry["rejectedFor"]})

    def _exhausted(self, deadline: float) -> str:
        if time.monotonic() > deadline:
            return f"the time limit of {self.limits.seconds:g} s ran out before a fix validated"
        return f"the limit of {self.limits.attempts} attempts was reached before a fix validated"

    def _enter(self, state: str, **detail) -> None:
        self.transitions.append({"state": state, **detail})

    def _verdict(self, report: dict, verdict: str, reason: str, started: float) -> dict:
        self._enter("done", verdict=verdict)
        report.update(verdict=verdict, reason=reason, attempts=[a.to_dict() for a in self.attempts],
                      transitions=self.transitions,
                      limits={"attempts": self.limits.attempts, "seconds": self.limits.seconds},
                      used={"attempts": len(self.attempts), "seconds": time.monotonic() - started})
        return json_safe(report)


def findings_of(found: Investigation) -> list[Finding]:
    """An investigation's findings in the order their nodes ran, each node once."""
    out: list[Finding] = []
    for f in sorted((f for f in (found.nonfinite, found.divergence) if f is not None), key=lambda f: f.tick):
        if all(f.node.index != o.node.index for o in out):
            out.append(f)
    return out
