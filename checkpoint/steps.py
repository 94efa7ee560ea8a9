"""What each tick of a Timeline does: run one node on a unit, or apply a user's edit (a step of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Edit:
    """A user's write of bytes into a value (setVariable, writeMemory): a step of its own."""

    value: str
    offset: int
    data: bytes
    description: str = ""


@dataclass(frozen=True)
class Step:
    unit: int
    node: int | None  # node index, None for an edit
    edit: Edit | None = None


def edit_frame(edit: Edit | None) -> dict[str, Any] | None:
    """An edit as a trace's STEP frame holds it (None for a node's step)."""
    if edit is None:
        return None
    return {"value": edit.value, "offset": edit.offset, "data": edit.data, "description": edit.description}
