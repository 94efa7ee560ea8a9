"""Candidate comparison requests (documented in docs/compare.md and docs/protocol.md): compareCandidate and
validateCandidate. The work is provenance/candidates/; the files are the client's, read from the session's
folder, and the program loaded in the session is not touched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from dap_server.events import working
from dap_server.requests import StrictArguments, request
from hardware.errors import RewindError
from hardware.jsonable import json_safe
from provenance.candidates.cli import validate_function
from provenance.candidates.comparison import Request, compare_sides

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it


class CompareCandidateArguments(StrictArguments):
    candidate: str = Field(min_length=1)  # model.py, model.py:entry, model.py@REV, or the file of `function`
    against: str = Field(min_length=1)  # model.py, model.py@HEAD~1, ref.py:function, or a driver
    function: str | None = None  # the candidate's function to compare (None: the candidate is a model file)
    inputs: str | None = None  # file.py:fn returning the arguments both functions are called with
    driver: str = "torch:cpu"  # where the candidate runs


def _request(args: CompareCandidateArguments) -> Request:
    return Request(args.candidate, args.against, args.function, args.inputs, args.driver)


@request("compareCandidate")
def compare_candidate(adapter: "RequestContext", args: CompareCandidateArguments) -> dict:
    """The report of `rewind compare --json`: the outputs judged, the headline naming the first candidate line
    that departs from what the reference implies, its evidence; or the refusal of a wrapper."""
    with working(adapter, "Comparing the candidate with the reference"):
        return json_safe(compare_sides(_request(args)))


@request("validateCandidate")
def validate_candidate(adapter: "RequestContext", args: CompareCandidateArguments) -> dict:
    """The report of `rewind validate --function --json`: every case of the coverage suite with its error."""
    if not args.function:
        raise RewindError("validateCandidate validates a function: give 'function', the candidate's function")
    with working(adapter, "Validating the candidate on the coverage suite"):
        return json_safe(validate_function(_request(args)))
