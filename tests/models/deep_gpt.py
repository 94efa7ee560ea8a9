"""The example GPT with four blocks: a loop over layers for reverse-continue tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import gpt  # noqa: E402


def build():
    return gpt.build(depth=4, width=16, heads=2, tokens=8)
