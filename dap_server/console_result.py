"""What a console command is (`rewind debug`): its names, syntax and one-line summary, in the one registry help
is made from; what it answers: its text and its data, or a CommandError; and the aligned tables the commands
print."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


class CommandError(Exception):
    """A command the console cannot run as typed."""


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
