"""Candidates compared with a trusted implementation: `rewind compare`, `rewind validate --function`
(docs/compare.md)."""
