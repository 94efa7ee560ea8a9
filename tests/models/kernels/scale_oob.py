"""Planted: a scale kernel whose load has no mask, so the last program reads past the end of x (n = 100 in
blocks of 32: 28 lanes outside)."""

import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, x * factor, mask=offs < n)


def kernel(n=100):
    torch.manual_seed(0)
    x = torch.randn(n)
    out = torch.empty_like(x)
    return scale_kernel, (triton.cdiv(n, 32),), (x, out, n, 2.5), {"BLOCK": 32}


def reference(x, out, n, factor, **blocks):
    return x * factor
