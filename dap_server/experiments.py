"""Experiments (documented in docs/protocol.md): addPatch, removePatch, listPatches, restoreBranch,
measureBranch, compareBranches. The work is the engine's (provenance/experiments.py): named branches
of named patches on the frozen pass, measured against the reference and the original, undone by
restoring the original. Each change of the installed branch invalidates variables and stacks."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from pydantic import Field

from dap_server.events import working
from dap_server.requests import StrictArguments, request
from hardware.errors import RewindError
from provenance.experiments import ORIGINAL
from provenance.fixes import named_patch

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

DEFAULT_BRANCH = "experiment"


class EditArguments(StrictArguments):
    value: str  # a node's output
    index: list[int]
    set: float


class AddPatchArguments(StrictArguments):
    name: str = Field(min_length=1, max_length=64)
    branch: str = DEFAULT_BRANCH
    node: str | None = None  # a node name, an op or a module path; every node it names is patched
    precision: str | None = None  # run at this dtype
    function: str | None = None  # Python source defining the function that replaces the op
    entry: str | None = None  # which function of `function`, when it defines several
    attributes: dict[str, Any] | None = None  # the op's attributes to change: {"eps": 1e-3}
    edit: EditArguments | None = None  # set one element of a node's output
    optimizer: dict[str, Any] | None = None  # a training step's optimizer hyperparameters to change: {"lr": 0.01}
    fromStep: int | None = None  # a training step: the nodes named as each step from this one on runs them


@request("addPatch")
def add_patch(adapter: "RequestContext", args: AddPatchArguments) -> dict:
    """Add a named patch to a branch and install that branch (the position stays)."""
    session = _launched(adapter)
    edit = args.edit.model_dump() if args.edit else None
    options = session.options
    patch = named_patch(session.program, args.name, args.node, precision=args.precision,
                        function=args.function, entry=args.entry, attributes=args.attributes, edit=edit,
                        optimizer=args.optimizer, from_step=args.fromStep,
                        model=(options.program, options.entry) if options else ("", ""))
    with _changing(adapter, f"Installing branch {args.branch}"):
        session.experiments.add(args.branch, patch)
    return session.experiments.listing()


class RemovePatchArguments(StrictArguments):
    name: str
    branch: str = DEFAULT_BRANCH


@request("removePatch")
def remove_patch(adapter: "RequestContext", args: RemovePatchArguments) -> dict:
    session = _launched(adapter)
    with _changing(adapter, f"Removing {args.name}"):
        session.experiments.remove(args.branch, args.name)
    return session.experiments.listing()


class ListPatchesArguments(StrictArguments):
    pass


@request("listPatches")
def list_patches(adapter: "RequestContext", args: ListPatchesArguments) -> dict:
    return _launched(adapter).experiments.listing()


class RestoreBranchArguments(StrictArguments):
    branch: str = ORIGINAL


@request("restoreBranch")
def restore_branch(adapter: "RequestContext", args: RestoreBranchArguments) -> dict:
    """Install a branch; the original by default: undo, the recorded pass back bit for bit."""
    session = _launched(adapter)
    with _changing(adapter, f"Restoring {args.branch}"):
        session.experiments.restore(args.branch)
    return session.experiments.listing()


class MeasureBranchArguments(StrictArguments):
    branch: str | None = None  # default: the installed one
    nodes: bool = True  # also every node from the patch point on (false: the outputs alone, faster)


@request("measureBranch")
def measure_branch(adapter: "RequestContext", args: MeasureBranchArguments) -> dict:
    """Outputs against the reference and the original, each node's error and time from the patch point on (a
    training Program's loss at each step too: `lossCurve`)."""
    session = _launched(adapter)
    branch = args.branch or session.experiments.active
    if branch == ORIGINAL:
        raise RewindError("the original is what branches are measured against: name a branch to measure")
    with _changing(adapter, f"Measuring branch {branch}"):
        return session.experiments.measure(branch, args.nodes)


class CompareBranchesArguments(StrictArguments):
    branches: list[str] = Field(min_length=1, max_length=16)


@request("compareBranches")
def compare_branches(adapter: "RequestContext", args: CompareBranchesArguments) -> dict:
    session = _launched(adapter)
    with _changing(adapter, f"Comparing {len(args.branches)} branch(es)"):
        return session.experiments.compare(args.branches)


def _launched(adapter: "RequestContext"):
    adapter.require_launched()
    return adapter.session


@contextmanager
def _changing(adapter: "RequestContext", title: str) -> Iterator[None]:
    """Progress while the installed branch changes; variables and stacks are stale afterwards."""
    try:
        with working(adapter, title[:200]):
            yield
    finally:
        adapter.variables.clear()
        adapter.events.invalidate("variables", "stacks")
