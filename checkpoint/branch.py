"""Branches of the Timeline: the future re-executed with patches, then set back as it was recorded.

A Patch changes how one node runs (here: at another precision; later kinds replace a node's
implementation or its attributes). `Timeline.branch(patches)` sets the recorded future aside
from the first patched step (its write log and versions, not its tensors, so memory stays
within the ring's budget) and re-executes from there with the patches. `Timeline.unbranch`
drops the branch and brings the recorded future back: its values are recomputed on demand
and checked against their recorded digests, so the original comes back bit for bit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from hardware.driver import Driver
from hardware.program import Node


class Patch(ABC):
    """A change to how one node runs on a branch."""

    node: int  # node index

    @abstractmethod
    def run(self, driver: Driver, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        """The node's outputs, in `node.outputs` order, computed the patched way."""

    @abstractmethod
    def describe(self) -> str: ...


@dataclass(frozen=True)
class PrecisionPatch(Patch):
    """Run a node with its floating-point arithmetic in `dtype`; its outputs keep that precision for
    patched consumers, and unpatched consumers read them converted back to the Program's dtype."""

    node: int
    dtype: str

    def run(self, driver: Driver, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        return driver.execute_at(node, args, kwargs, self.dtype)

    def describe(self) -> str:
        return f"run at {self.dtype}"


@dataclass
class Branch:
    """What a branch set aside: enough to bring the recorded future back exactly."""

    tick: int  # the first patched step: the future from here was re-executed
    position: int  # where the timeline stood when the branch began
    frontier: int
    patches: dict[int, Patch]  # the patches in force before this branch
    log: dict[str, np.ndarray]  # the write log's records from `tick` on
    versions: dict[str, list[int]]  # each value's version ticks from `tick` on
    schedule: list
    node_tick: list[int]
    recorder: Any  # a trace being recorded continuously: it records the original, not branches
    archive: Any


@dataclass(frozen=True)
class ArchiveBefore:
    """A trace archive seen from a branch: only its versions written before the branch began."""

    archive: Any
    tick: int

    def has(self, key: tuple[str, int]) -> bool:
        return key[1] < self.tick and self.archive.has(key)

    def load(self, key: tuple[str, int]) -> Any | None:
        return self.archive.load(key) if key[1] < self.tick else None
