"""Failures in the user's terms: what a client is told when a request or a motion fails.

Never an exception class name or a traceback: those go to the server log. A program's own `sys.exit()` or
keyboard interrupt is named as what the program did.
"""

from __future__ import annotations

import logging

from hardware.errors import RewindError, brief, echo, program_stopped_itself

log = logging.getLogger("dap_server")


class Cancelled(RewindError):
    """The client cancelled the request before it ran."""


class ExpiredReference(RewindError):
    """A reference the last motion cleared: an editor redrawing the stop before asks for one (VS Code does, mid-step).
    Refused, but not shown to the user as a failure of theirs (`showUser` false)."""


def describe_failure(command: str, exc: BaseException) -> str:
    """What went wrong, in the user's terms: never an exception class name or a traceback."""
    if isinstance(exc, Cancelled):
        return "cancelled"
    if isinstance(exc, RewindError):
        return brief(str(exc))
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return f"{program_stopped_itself(exc, f'Rewind ran {echo(command)!r}')}; the debug session goes on"
    log.error("%s failed", command, exc_info=exc)
    return (f"Rewind could not complete '{echo(command)}': {echo(str(exc), 200) or 'an unexpected failure'} "
            "(a bug in Rewind; the server log has the details)")



