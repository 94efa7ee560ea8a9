"""Values as JSON can carry them: JSON has no words for NaN and the infinities."""

from __future__ import annotations

import math
from typing import Any


def json_safe(obj: Any) -> Any:
    """`obj` with every NaN and infinity spelled "nan", "inf", "-inf" (dicts, lists and tuples walked)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
