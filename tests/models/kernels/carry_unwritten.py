"""Planted: every program adds a carry it loads from the slot after the outputs, which no program ever writes (the
kernel that should fill it was never launched): each reads what torch.empty left there."""

import torch
import triton
import triton.language as tl


@triton.jit
def carry_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    carry = tl.load(out_ptr + n)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, x + carry, mask=offs < n)


def kernel(n=40):
    torch.manual_seed(0)
    x = torch.randn(n)
    out = torch.empty(n + 1)
    return carry_kernel, (triton.cdiv(n, 16),), (x, out, n), {"BLOCK": 16}
