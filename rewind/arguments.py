"""What a caller of the Python API passed, checked: a wrong type or value is a RewindError naming the parameter
and what it takes, never a Python exception from deep inside the engine."""

from __future__ import annotations

import operator
import os
import re

from hardware.errors import RewindError, echo


def kind_of(value: object) -> str:
    return f"a value of type {type(value).__name__}"


def text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise RewindError(f"{name} must be text (a str), got {kind_of(value)}")
    return value


def text_or_none(name: str, value: object) -> str | None:
    return None if value is None else text(name, value)


def path_text(name: str, value: object) -> str:
    """A path given as text or as a path object."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)  # type: ignore[return-value]
    return text(name, value)


def whole(name: str, value: object) -> int:
    """A whole number as Python spells one (an int, a numpy integer, a 0-d integer tensor); never a bool."""
    if isinstance(value, bool):
        raise RewindError(f"{name} must be a whole number, got a bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise RewindError(f"{name} must be a whole number, got {kind_of(value)} ({echo(repr(value))})") from None


def whole_or_none(name: str, value: object) -> int | None:
    return None if value is None else whole(name, value)


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise RewindError(f"{name} must be True or False, got {kind_of(value)}")
    return value


def choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise RewindError(f"{name} must be one of {', '.join(allowed)}; got {echo(repr(value))}")
    return value


def python_names(message: str) -> str:
    """A request's message about its fields ('maxTrials') in the names this API's parameters have ('max_trials')."""
    return re.sub(r"'([a-z]+[A-Z]\w*)'", lambda m: "'" + re.sub(r"([A-Z])", lambda c: "_" + c[1].lower(), m[1]) + "'",
                  message)
