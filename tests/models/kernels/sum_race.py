"""Planted: every program adds its block's sum into one accumulator with a load and a store (a read-modify-write
two programs can interleave), where `tl.atomic_add` is needed."""

import torch
import triton
import triton.language as tl


@triton.jit
def sum_kernel(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    partial = tl.sum(x, axis=0)
    total = tl.load(total_ptr)
    tl.store(total_ptr, total + partial)


def kernel(n=100):
    torch.manual_seed(0)
    x = torch.randn(n)
    total = torch.zeros(1)
    return sum_kernel, (triton.cdiv(n, 32),), (x, total, n), {"BLOCK": 32}


def reference(x, total, n, **blocks):
    return x.double().sum().reshape(1).float()
