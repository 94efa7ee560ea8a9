"""Planted: a blocked matmul whose K loop stops before the tail block (`K // BLOCK_K` blocks, where
`tl.cdiv(K, BLOCK_K)` is needed), so the last K % BLOCK_K columns of A never reach C."""

import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K // BLOCK_K):
        rk = k * BLOCK_K + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def kernel(M=20, N=24, K=40):
    torch.manual_seed(0)
    a, b = torch.randn(M, K), torch.randn(K, N)
    c = torch.empty(M, N)
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    return matmul_kernel, grid, (a, b, c, M, N, K), {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}


def reference(a, b, c, M, N, K, **blocks):
    return (a.double() @ b.double()).float()
