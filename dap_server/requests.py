"""The request registry: `@request("X")` registers a handler, `@capability` sits next to it.

    @request("readMemory")
    @capability("supportsReadMemoryRequest")
    def read_memory(adapter: Adapter, args: ReadMemoryArguments) -> dict: ...

so `grep '@request("readMemory"'` finds the one place a request goes, and `initialize`
advertises exactly the capabilities of the handlers that exist. A handler's arguments are
the pydantic model its `args` parameter is annotated with, checked before it runs.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from dap_server.protocol import JSON_KINDS
from hardware.errors import RewindError, echo


class Arguments(BaseModel):
    """A standard DAP request's arguments: fields DAP may add later are ignored, wrong types are errors."""

    model_config = ConfigDict(extra="ignore", strict=True)


class StrictArguments(Arguments):
    """Arguments of our own requests and of launch: an unknown field is a typo and an error."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ArgumentsError(RewindError):
    """A request's arguments do not match its model."""


@dataclass
class Handler:
    command: str
    fn: Callable[..., Any]
    arguments: type[Arguments]
    on_loop: bool  # answered on the event loop, never queued behind the session's worker
    interrupts: bool  # pause a running motion before queueing (terminate, disconnect)
    capabilities: dict[str, Any] = field(default_factory=dict)

    def parse(self, raw: Any) -> Arguments:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ArgumentsError(f"{self.command}: arguments must be a JSON object, got {JSON_KINDS.get(type(raw), 'a value')}")
        try:
            return self.arguments.model_validate(raw)
        except ValidationError as exc:
            raise ArgumentsError(describe_validation_error(self.command, self.arguments, exc)) from None


REQUESTS: dict[str, Handler] = {}


def request(command: str, *, on_loop: bool = False, interrupts: bool = False):
    """Register `fn(adapter, args)` as the handler of `command`."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if command in REQUESTS:
            raise RuntimeError(f"request '{command}' is registered twice")
        model = fn.__annotations__["args"]
        if isinstance(model, str):  # postponed annotations: the model class is a name in the handler's module
            model = fn.__globals__[model]
        REQUESTS[command] = Handler(command, fn, model, on_loop, interrupts, dict(getattr(fn, "_capabilities", {})))
        return fn

    return register


def capability(name: str, value: Any = True):
    """Advertise `name` in initialize's response, for as long as the decorated handler exists."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        caps = dict(getattr(fn, "_capabilities", {}))
        caps[name] = value
        fn._capabilities = caps  # type: ignore[attr-defined]
        return fn

    return mark


def capabilities() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for handler in REQUESTS.values():
        out.update(handler.capabilities)
    return out


def describe_validation_error(command: str, model: type[BaseModel], exc: ValidationError) -> str:
    """One line naming every bad field: unknown ones (with the known ones), missing ones, mistyped ones."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field '{echo(where)}' (known: {', '.join(_known_fields(model, err['loc']))})")
        elif err["type"] == "missing":
            parts.append(f"missing required field '{echo(where)}'")
        else:
            parts.append(f"field '{echo(where)}': {err['msg'].lower()}, got {echo(repr(err['input']))}")
    return f"{command}: " + "; ".join(parts)


def _known_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """The fields of the (possibly nested) model that holds the unknown field at `loc`."""
    for part in loc[:-1]:
        info = model.model_fields.get(str(part)) if isinstance(part, str) else None
        if info is None:
            break
        candidates = (info.annotation, *typing.get_args(info.annotation))
        nested = [t for t in candidates if isinstance(t, type) and issubclass(t, BaseModel)]
        if not nested:
            break
        model = nested[0]
    return [f.alias or name for name, f in model.model_fields.items()]
