"""Errors every surface shows to the user. Each names its cause in plain words."""

import os
import traceback


class RewindError(Exception):
    """Base class: a problem the user can act on (bad input, unsupported op, ...)."""


class ProgramLoadError(RewindError):
    """The user's model file could not be turned into a Program."""


class UnsupportedOpError(RewindError):
    """A driver cannot run one or more ops of the Program."""


class DriverError(RewindError):
    """A driver spec is unknown or its device is not available."""


class NotStoppedError(RewindError):
    """An inspection was asked for while the session is running or not launched."""


class ExpressionError(RewindError):
    """An expression (condition, watch, evaluate) is invalid or refused."""


def raised_in_user_code(exc: BaseException, file: str | os.PathLike) -> str:
    """What the user's own code raised, in words: its message and the line of their file it came from
    (a class name is Python's vocabulary, not the user's problem)."""
    frames = traceback.extract_tb(exc.__traceback__)
    theirs = [f for f in frames if os.path.realpath(f.filename) == os.path.realpath(file)] or frames[-1:]
    where = f" (at {os.path.basename(theirs[-1].filename)}:{theirs[-1].lineno})" if theirs else ""
    return (str(exc).strip() or "an error without a message") + where
