"""The fix of off_by_one.py: each block slice ends at start + BLOCK, as blocked_attention_fixed.py's do."""

from blocked_attention_fixed import blocked_attention as offset_attention  # noqa: F401
from reference import attention_inputs


def inputs():
    return attention_inputs()
