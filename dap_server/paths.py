"""The paths a user gives, resolved against the session's working directory.

A program, a trace, a recording, a reference file, a spill folder, a saved trace, a knowledge base: a relative
path means what it would in the user's shell, so it is resolved against the session's working directory. That
is launch's `cwd` (an absolute path of an existing folder), or, when the launch gives none, the one the session
had before (a restart with new arguments keeps it), or else the directory the adapter was started in, which
the engine process inherits.

An engine process serves one session, so it also moves into the session's working directory (dap_server/engine.py
asks for that): the program's own relative paths (`open("weights.pt")` in build()) mean what they would under
`python model.py` there. An engine inside the server process (`--in-process`) shares the process with every
session and leaves its working directory alone; only the paths Rewind is given are resolved.
"""

from __future__ import annotations

import os
import stat
from typing import Protocol

from hardware.errors import RewindError, echo, os_reason

_follow = False  # set in an engine process: the process moves into its session's working directory


def follow_session_cwd() -> None:
    """This process serves one session: from now on it moves into the working directory the session launches in."""
    global _follow
    _follow = True


def checked_cwd(value: str, command: str = "launch") -> str:
    """launch's `cwd` as given: the absolute path of a folder that exists; anything else is an error saying why."""
    if "\0" in value:
        raise RewindError(f"{command}: 'cwd' contains a NUL character: give the absolute path of a folder")
    if not value.strip():
        raise RewindError(f"{command}: 'cwd' is empty: give the absolute path of a folder (relative paths start "
                          "there)")
    if not os.path.isabs(value):
        raise RewindError(f"{command}: 'cwd' must be an absolute path (the folder relative paths start from), got "
                          f"'{echo(value)}'")
    try:
        mode = os.stat(value).st_mode
    except FileNotFoundError:
        raise RewindError(f"{command}: cwd {echo(value, 200)} does not exist: give the absolute path of a folder") \
            from None
    except (OSError, ValueError) as exc:
        raise RewindError(f"{command}: cwd {echo(value, 200)} cannot be opened: {os_reason(exc)}") from None
    if not stat.S_ISDIR(mode):
        raise RewindError(f"{command}: cwd {echo(value, 200)} is a file, not a folder: give the folder relative "
                          "paths start from")
    if not os.access(value, os.X_OK):
        raise RewindError(f"{command}: cwd {echo(value, 200)} cannot be entered: permission denied")
    return os.path.normpath(value)


class HasCwd(Protocol):
    cwd: str | None  # the working directory the session's last launch gave (None: not launched in one yet)


def session_cwd(session: HasCwd) -> str:
    """The session's working directory: the one its last launch gave, else where this process runs."""
    if session.cwd is not None:
        return session.cwd
    try:
        return os.getcwd()
    except OSError:  # the folder the adapter was started in was removed since
        raise RewindError("the folder Rewind was started in no longer exists: give launch a 'cwd' (the absolute "
                          "path of the folder relative paths start from)") from None


def absolute(path: str | None, cwd: str) -> str | None:
    """`path` as an absolute path, a relative one taken from `cwd`; an empty path stays empty (the request then
    says what is missing), an absolute one stays as it is."""
    if not path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(cwd, path))


def in_session(session: HasCwd, path: str) -> str:
    """A path a request gives (saveTrace's, a knowledge base's), from the session's working directory."""
    return absolute(path, session_cwd(session)) or path


class Entering:
    """The session moves into `cwd` for a launch: remembered as its working directory once the launch succeeds, and
    in an engine process entered (before the program's build() runs); a launch that fails leaves both as they were."""

    def __init__(self, session: HasCwd, cwd: str):
        self.session, self.cwd = session, cwd
        self._left: str | None = None

    def __enter__(self) -> "Entering":
        if not _follow:
            return self
        try:
            here = os.getcwd()
        except OSError:  # removed since: there is nowhere to come back to
            here = None
        if here != self.cwd:
            try:
                os.chdir(self.cwd)
            except OSError as exc:
                raise RewindError(f"cwd {echo(self.cwd, 200)} cannot be entered: {os_reason(exc)}") from None
            self._left = here
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.session.cwd = self.cwd
        elif self._left is not None:
            try:
                os.chdir(self._left)
            except OSError:
                pass
