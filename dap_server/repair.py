"""The repair loop through the wire (documented in docs/protocol.md): repair, suggestFixes. The loop is
the engine's (provenance/repair.py): forensics, candidate fixes, integrity, validation on generated
inputs, a verdict with its evidence; fixes that validate go into the knowledge base."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from dap_server.events import working
from dap_server.paths import in_session
from dap_server.requests import StrictArguments, request
from provenance.fixes import text_file
from provenance.inputs import DEFAULT_SCALES, DEFAULT_SEEDS, DEFAULT_SHAPES, InputPlan
from provenance.investigation import investigate
from provenance.knowledge import KnowledgeBase
from provenance.repair import DEFAULT_ATTEMPTS, DEFAULT_SECONDS, FixText, RepairLimits, RepairLoop, findings_of
from provenance.repair_cli import with_source_diffs

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it


class FixArguments(StrictArguments):
    text: str  # a fix file's text: Python defining PATCHES
    name: str = Field("fix.py", min_length=1, max_length=200)  # what the verdict calls it


class RepairArguments(StrictArguments):
    fixes: list[FixArguments] = []  # tried in order
    suggest: bool | None = None  # then the knowledge base's suggestions (default: only when no fix is given)
    maxAttempts: int = Field(DEFAULT_ATTEMPTS, ge=1, le=100)
    timeLimit: float = Field(DEFAULT_SECONDS, gt=0, le=86_400)  # seconds for the whole loop
    seeds: int = Field(DEFAULT_SEEDS, ge=0, le=32)
    scales: list[float] = list(DEFAULT_SCALES)
    shapes: int = Field(DEFAULT_SHAPES, ge=0, le=8)
    knowledge: str | None = None  # the knowledge base file (default: the user's cache; relative: from launch's `cwd`)


@request("repair")
def repair(adapter: "RequestContext", args: RepairArguments) -> dict:
    """Run the repair loop on the loaded program; the verdict with its evidence."""
    with working(adapter, "Repairing"):
        limits = RepairLimits(args.maxAttempts, args.timeLimit)
        loop = RepairLoop(adapter.session, KnowledgeBase(_knowledge(adapter, args.knowledge)), limits,
                          InputPlan(args.seeds, tuple(args.scales), args.shapes))
        fixes = [FixText(f.text, text_file(f.text, f.name), f.name) for f in args.fixes]
        report = loop.run(fixes, suggest=args.suggest if args.suggest is not None else not fixes)
        return with_source_diffs(report, loop)  # the validated fix as a diff of the model's source


class SuggestFixesArguments(StrictArguments):
    limit: int = Field(3, ge=1, le=32)  # candidates at most
    knowledge: str | None = None


@request("suggestFixes")
def suggest_fixes(adapter: "RequestContext", args: SuggestFixesArguments) -> dict:
    """The knowledge base's candidate fixes for this pass's findings, not yet validated (repair validates)."""
    with working(adapter, "Suggesting fixes"):
        session = adapter.session
        knowledge = KnowledgeBase(_knowledge(adapter, args.knowledge))
        findings = findings_of(investigate(session, ablate=False, origin=False, drift=False))
        suggestions = []
        for finding in findings:
            for candidate in knowledge.suggest(finding, session.forensics):
                if len(suggestions) == args.limit:
                    break
                suggestions.append({"finding": finding.node.name, **candidate.to_dict(session.program)})
    return {"findings": [f.to_dict() for f in findings], "suggestions": suggestions}


def _knowledge(adapter: "RequestContext", path: str | None) -> str | None:
    """The knowledge base file a request names, from the session's working directory; None: the default one."""
    return in_session(adapter, path) if path else path
