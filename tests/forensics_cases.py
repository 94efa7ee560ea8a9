"""The planted-bug models of tests/models/forensics/ and what forensics must say about each.

Lines are found by the marker comments in the model files, never hard-coded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.conftest import EXAMPLES, MODELS, line_of

FORENSICS = MODELS / "forensics"


@dataclass(frozen=True)
class Planted:
    model: str
    nonfinite: tuple[str, str, str, str] | None  # (exception filter, node, pattern, line marker), or no NaN/Inf
    divergence: tuple[str, str, str] | None  # (node, pattern, line marker)
    precision_fixes: bool = True  # the reference is clean there, so running some nodes wider fixes the outputs

    @property
    def path(self) -> Path:
        return FORENSICS / f"{self.model}.py"

    def line(self, marker: str) -> int:
        return line_of(self.path, marker)


PLANTED = [
    Planted("softmax_overflow", ("inf", "exp", "exp-overflow", "# BUG"), ("exp", "exp-overflow", "# BUG")),
    Planted("rsqrt_no_epsilon", ("inf", "rsqrt", "division-by-zero", "# BUG"),
            ("rsqrt", "division-by-zero", "# BUG")),
    Planted("log_domain", ("inf", "log", "outside-domain", "# BUG"), ("log", "outside-domain", "# BUG")),
    Planted("sqrt_domain", ("nan", "sqrt", "outside-domain", "# NaN"),
            ("sub", "catastrophic-cancellation", "# BUG")),
    Planted("cancellation", None, ("rsub", "catastrophic-cancellation", "# BUG")),
    Planted("bf16_accumulation", None, ("add_21", "low-precision-accumulation", "# BUG")),
    Planted("masked_row", ("nan", "softmax", "fully-masked-softmax-row", "# BUG"), None, precision_fixes=False),
]

# absorbed_log: a -inf written on purpose and absorbed before any output, as T5's relative-position buckets do
CLEAN = [EXAMPLES / "gpt.py", EXAMPLES / "mlp.py", FORENSICS / "clean_half.py", FORENSICS / "mixed_precision.py",
         FORENSICS / "absorbed_log.py"]


def ids(cases) -> list[str]:
    return [c.model if isinstance(c, Planted) else c.stem for c in cases]
