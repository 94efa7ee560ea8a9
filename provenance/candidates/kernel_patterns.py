"""The knowledge base's patterns for kernels: what a candidate's departure (provenance/candidates/localize.py)
looks like when it is a known mistake, and its fix. Each recognizer reads the departure's evidence, never the
candidate's file name; the planted examples are tests/models/candidates/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from provenance.candidates.localize import Departure


@dataclass(frozen=True)
class KernelPattern:
    name: str
    title: str
    fix: str
    matches: Callable[[Departure], bool]

    def to_dict(self) -> dict:
        return {"pattern": self.name, "title": self.title, "fix": self.fix}


def _rows_of_a_growing_max(d: Departure) -> bool:
    return d.how == "prefix" and any("would have to change" in e for e in d.evidence) \
        and any("grows past the first block" in e for e in d.evidence)


KERNEL_PATTERNS = (
    KernelPattern("accumulator-not-rescaled", "accumulator not rescaled when the running max grows",
                  "multiply the accumulator by exp(m_old - m_new) before adding the block's contribution, as the "
                  "normalizer is (acc = acc * alpha + p @ v)", _rows_of_a_growing_max),
    KernelPattern("tail-block-dropped", "tail block dropped (or masked wrong)",
                  "run the loop to the end of the input (range(0, n, BLOCK)) and let the last slice be short, or "
                  "mask the positions past the end instead of skipping the block", lambda d: d.how == "tail"),
    KernelPattern("block-index-off-by-one", "off-by-one in a block index",
                  "make block j read [j * BLOCK, (j + 1) * BLOCK): each slice starts where the previous ended",
                  lambda d: d.how == "gap"),
    KernelPattern("wrong-reduction-axis", "reduction over the wrong axis",
                  "reduce over the axis the reference reduces (each row's features: dim=-1), keeping the others",
                  lambda d: d.how == "dependence"),
)


def classify(departure: Departure | None) -> KernelPattern | None:
    if departure is None:
        return None
    return next((p for p in KERNEL_PATTERNS if p.matches(departure)), None)
