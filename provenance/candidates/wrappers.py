"""Anti-cheat for kernels: a candidate that calls the reference's own operator (or torch's implementation of it)
is wrapper-assisted, not a kernel, and is refused with the call named before anything is measured.

The reference's operators are those of its Program that are not elementary arithmetic, data movement or plain
reductions (what a kernel is made of); torch's implementations of one are the operators whose names contain its
name (`_scaled_dot_product_flash_attention_for_cpu`, `native_layer_norm`)."""

from __future__ import annotations

from hardware.program import Program

ELEMENTARY = frozenset("""
add sub mul div neg abs exp log sqrt rsqrt pow reciprocal maximum minimum max min amax amin sum mean var
matmul mm bmm addmm linear t transpose permute view reshape expand unsqueeze squeeze slice select cat stack
full zeros ones empty arange scalar_tensor clone copy alias _to_copy to contiguous where masked_fill eq ne lt le gt ge
logical_not logical_and any all detach lift_fresh_copy zeros_like ones_like full_like split chunk getitem
""".split())


def own_operators(reference: Program) -> set[str]:
    """The reference's operators a kernel must not call: `scaled_dot_product_attention` for F.sdpa."""
    return {_base(n.op) for n in reference.nodes if _base(n.op) not in ELEMENTARY}


def wrapper_call(candidate: Program, reference: Program, display) -> str | None:
    """Why the candidate is refused (its first call of a reference operator, named with its line), or None."""
    forbidden = own_operators(reference)
    if not forbidden:
        return None
    for node in candidate.nodes:
        base = _base(node.op)
        hit = next((f for f in sorted(forbidden) if f == base or f in base), None)
        if hit is None:
            continue
        where = "a line Rewind cannot name"
        if node.loc is not None:
            text = candidate.source_files.get(node.loc.file, "").splitlines()
            said = text[node.loc.line - 1].strip() if 0 < node.loc.line <= len(text) else ""
            where = f"line {node.loc.line} of {display(node.loc.file)}" + (f" (`{said}`)" if said else "")
        return (f"wrapper-assisted, not a kernel: {where} calls {node.op_short}, "
                + ("the reference's own operator" if hit == base else f"torch's implementation of the reference's "
                   f"operator {hit}") + "; a kernel computes it itself")
    return None


def _base(op: str) -> str:
    """`aten.scaled_dot_product_attention.default` -> `scaled_dot_product_attention`."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op
