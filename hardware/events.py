"""What the Session reports as it works, in its own vocabulary (dap_server/events.py turns it into DAP)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SessionEvent:
    kind: str  # "stopped", "output", "progress", "invalidated", "nondeterminism"
    body: dict
