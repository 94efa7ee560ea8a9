"""What a console command answers (`rewind debug`): its text and its data, or a CommandError; and the
aligned tables the commands print."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class CommandError(Exception):
    """A command the console cannot run as typed."""


@dataclass
class Result:
    text: str
    data: dict[str, Any] = field(default_factory=dict)


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Lines of `rows` under `header`, each column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
