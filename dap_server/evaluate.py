"""evaluate: the safe expression language (hardware/expressions.py) over the values at the position.

Hovers, watches and the REPL all land here. Expressions are checked node by node before they
run: no imports, no attributes outside a whitelist, no dunders, nothing that reaches code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dap_server.requests import Arguments, capability, request
from dap_server.variables import result_variable, value_variable
from hardware.errors import RewindError

if TYPE_CHECKING:
    from dap_server.adapter import Adapter


class EvaluateArguments(Arguments):
    expression: str
    frameId: int | None = None
    context: str | None = None
    format: dict | None = None


@request("evaluate")
@capability("supportsEvaluateForHovers")
def evaluate(adapter: "Adapter", args: EvaluateArguments) -> dict:
    adapter.require_launched()
    level = adapter.frame_level(args.frameId)
    text = args.expression.strip()
    result = adapter.session.evaluate(text, level=level)
    if not isinstance(result, torch.Tensor):
        return {"result": str(result), "type": type(result).__name__, "variablesReference": 0}
    try:  # a bare name is a Program value: show it with its location and writer
        variable = value_variable(adapter, text, adapter.resolve_value(text, level), text)
    except RewindError:
        variable = result_variable(adapter, text, result, f"({text})")
    variable.pop("name")
    variable["result"] = variable.pop("value")
    return variable
