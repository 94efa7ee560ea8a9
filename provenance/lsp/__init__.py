"""The Rewind language server: findings as diagnostics and line writes as hovers, for any LSP editor.

Run it with `python -m provenance.lsp` (stdio) or `python -m provenance.lsp --tcp --port N`.
"""
