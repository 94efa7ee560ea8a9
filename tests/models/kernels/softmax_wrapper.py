"""Wrapper-assisted: a "kernel" whose kernel() computes the answer with torch.softmax and has the Triton kernel
only copy it out: it passes any check against the reference without being a softmax kernel."""

import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(src_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    v = tl.load(src_ptr + row * n_cols + cols, mask=mask)
    tl.store(out_ptr + row * n_cols + cols, v, mask=mask)


def kernel(rows=4, cols=10):
    torch.manual_seed(0)
    x = torch.randn(rows, cols) - 3.0
    out = torch.empty_like(x)
    done = torch.softmax(x, dim=-1)
    return copy_kernel, (rows,), (done, out, cols), {"BLOCK": triton.next_power_of_2(cols)}


def reference(x, out, n_cols, BLOCK=None):
    return torch.softmax(x.double(), dim=-1).float()
