"""evaluate: the safe expression language (hardware/expressions.py) over the values at the position.

Hovers, watches and the REPL all land here. Expressions are checked node by node before they
run: no imports, no attributes outside a whitelist, no dunders, nothing that reaches code.
A result's text is capped (MAX_RESULT_CHARS): past it the reply says how big the whole was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import torch

from dap_server.requests import Arguments, capability, request
from dap_server.variables import result_variable, value_variable
from hardware.errors import RewindError

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

MAX_RESULT_CHARS = 64 * 1024


class EvaluateArguments(Arguments):
    expression: str
    frameId: int | None = None
    context: str | None = None
    format: dict | None = None


@request("evaluate")
@capability("supportsEvaluateForHovers")
def evaluate(adapter: "RequestContext", args: EvaluateArguments) -> dict:
    adapter.require_launched()
    level = adapter.frame_level(args.frameId)
    text = args.expression.strip()
    result = adapter.session.evaluate(text, level=level)
    if not isinstance(result, torch.Tensor):
        return {"result": result_text(result), "type": _type_name(result), "variablesReference": 0}
    try:  # a bare name is a Program value: show it with its location and writer
        variable = value_variable(adapter, text, adapter.resolve_value(text, level), text)
    except RewindError:
        variable = result_variable(adapter, text, result, f"({text})")
    variable.pop("name")
    variable["result"] = variable.pop("value")
    return variable


def result_text(value: Any, limit: int = MAX_RESULT_CHARS) -> str:
    """str(value), at most `limit` characters; past that, a note of how big the whole text is.

    Lists and tuples are written piece by piece, so a long one costs no more than its first `limit`
    characters (the whole size is then estimated from the items written)."""
    if isinstance(value, str):
        return value if len(value) <= limit else _truncated(value[:limit], len(value), exact=True)
    if type(value) not in (list, tuple):
        text = str(value)
        return text if len(text) <= limit else _truncated(text[:limit], len(text), exact=True)
    pieces: list[str] = []
    written = 0
    items = [0]  # top-level items written in full
    for piece in _pieces(value, items, top=True):
        pieces.append(piece)
        written += len(piece)
        if written > limit:
            text = "".join(pieces)[:limit]
            estimate = written if not items[0] else max(written, written * len(value) // items[0])
            return _truncated(text, estimate, exact=False)
    return "".join(pieces)


def _pieces(value: Any, items: list[int], top: bool = False) -> Iterator[str]:
    if type(value) not in (list, tuple):
        yield repr(value)
        return
    opening, closing = ("[", "]") if isinstance(value, list) else ("(", ")")
    yield opening
    for i, item in enumerate(value):
        if i:
            yield ", "
        yield from _pieces(item, items)
        if top:
            items[0] += 1
    if isinstance(value, tuple) and len(value) == 1:
        yield ","
    yield closing


def _truncated(text: str, total: int, exact: bool) -> str:
    about = "" if exact else "about "
    return f"{text} … (truncated: {about}{_size(total)} of text; ask for a slice)"


def _size(chars: int) -> str:
    for unit in ("characters", "KiB", "MiB", "GiB"):
        if chars < 1024 or unit == "GiB":
            return f"{chars} {unit}" if unit == "characters" else f"{chars:.0f} {unit}"
        chars /= 1024
    return f"{chars:.0f} GiB"


def _type_name(value: Any) -> str:
    if isinstance(value, torch.Size):
        return "shape"
    if isinstance(value, torch.dtype):
        return "dtype"
    return type(value).__name__
