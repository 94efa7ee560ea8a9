"""Planted: a row softmax whose masked load pads with 0.0, so the padded lanes join the row's max and its sum
(`other=-float("inf")` is what a softmax needs). Rows of 10 in blocks of 16: 6 padded lanes a row."""

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    row_max = tl.max(x, axis=0)
    num = tl.exp(x - row_max)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * n_cols + cols, num / den, mask=mask)


def kernel(rows=4, cols=10):
    torch.manual_seed(0)
    x = torch.randn(rows, cols) - 3.0
    out = torch.empty_like(x)
    return softmax_kernel, (rows,), (x, out, cols), {"BLOCK": triton.next_power_of_2(cols)}


def reference(x, out, n_cols, BLOCK=None):
    return torch.softmax(x.double(), dim=-1).float()
