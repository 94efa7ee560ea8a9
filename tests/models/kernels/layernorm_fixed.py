"""Fixed twin of layernorm_stride.py: rows are `stride` elements apart."""

import torch
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, out_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    diff = tl.where(mask, x - mean, 0.0)
    var = tl.sum(diff * diff, axis=0) / n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = diff / tl.sqrt(var + eps) * w
    tl.store(out_ptr + row * stride + cols, y, mask=mask)


def kernel(rows=6, cols=24):
    torch.manual_seed(0)
    x, w = torch.randn(rows, cols), torch.rand(cols) + 0.5
    out = torch.empty_like(x)
    return layernorm_kernel, (rows,), (x, w, out, x.stride(0), cols, 1e-5), {"BLOCK": triton.next_power_of_2(cols)}


def reference(x, w, out, stride, n_cols, eps, **blocks):
    return torch.nn.functional.layer_norm(x.double(), (n_cols,), w.double(), eps=eps).float()
