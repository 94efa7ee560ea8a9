"""Errors every surface shows to the user. Each names its cause in plain words."""

import errno
import os
import re
import traceback

ECHO = 60  # characters of the user's own input quoted back in a message
# A quoted part this long is the user's input, not a name. It opens after a space, a bracket or the start and
# closes before one (so the text between two quoted names, 'exp' ... 'eps', is never taken for one).
_QUOTED = re.compile(r"(?<![^\s(\[:=])'([^'\s][^']{78,}[^'\s])'(?=$|[\s),.;:\]])")


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


def echo(text: str, limit: int = ECHO) -> str:
    """The user's own input as quoted in a message: at most `limit` characters, on one line."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + f"… ({len(text)} characters)"


def brief(message: str) -> str:
    """A message with each long quoted part (the user's own input, quoted where it was refused) cut short."""
    return _QUOTED.sub(lambda m: f"'{echo(m[1])}'", message)


def os_reason(exc: BaseException) -> str:
    """Why the system refused a path, in words (no error number, no class name)."""
    if isinstance(exc, ValueError):
        return "the path contains a NUL character"
    if getattr(exc, "errno", None) == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    return (getattr(exc, "strerror", None) or "the system refused it").lower()


def program_stopped_itself(exc: BaseException, doing: str) -> str:
    """What a program did when it raised SystemExit or KeyboardInterrupt while Rewind was `doing` something:
    named as the program's act, so the process that runs it can go on."""
    if isinstance(exc, SystemExit):
        return f"the program called sys.exit({echo(repr(exc.code))}) while {doing}"
    return f"the program raised a keyboard interrupt while {doing}"
