"""What a console command is (`rewind debug`): its names, syntax and one-line summary, in the one registry help
is made from; what it answers: its text and its data, or a CommandError; and the aligned tables the commands
print."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


class CommandError(Exception):
    """A command the console cannot run as typed."""


MOST_DIGITS = 18  # more than any tick, line, frame, rank or count of a run has


def whole_number(text: str, what: str, least: int = 0) -> int:
    """`text` as a whole number of at least `least`, else a CommandError: `what` the command takes, and what it got.
    Every number a command reads goes through it: int() alone takes other scripts' digits, signs and spaces, and
    raises on a number of thousands of digits."""
    digits = text.isascii() and text.isdigit()
    if digits and len(text) > MOST_DIGITS:
        raise CommandError(f"{what} (got a number of {len(text)} digits, more than any run has)")
    if not digits or int(text) < least:
        raise CommandError(f"{what} (got '{text[:40]}')")
    return int(text)


@dataclass
class Result:
    text: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Command:
    """One console command: the names it answers to (the first is its own), what runs it (None from it: quit),
    its syntax and what it does, in one line each."""

    names: tuple[str, ...]
    run: Callable[[str], Result | None]
    syntax: str
    summary: str

    def to_dict(self) -> dict:
        return {"name": self.names[0], "aliases": list(self.names[1:]), "syntax": self.syntax,
                "summary": self.summary}


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Lines of `rows` under `header`, each column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
