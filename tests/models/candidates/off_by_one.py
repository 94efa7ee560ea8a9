"""Blocked attention whose block slices end one key early (`start + BLOCK - 1`): the last key of every block is
read by no line. Planted off-by-one in a block index; off_by_one_fixed.py is the fix."""

import math

import torch

from reference import attention_inputs

BLOCK = 16


def offset_attention(q, k, v):
    n, d = q.shape
    scale = 1.0 / math.sqrt(d)
    work = torch.promote_types(q.dtype, torch.float32)  # accumulate in float32 at least
    m = torch.full((n, 1), float("-inf"), dtype=work)
    l = torch.zeros(n, 1, dtype=work)
    acc = torch.zeros(n, v.shape[-1], dtype=work)
    for start in range(0, k.shape[0], BLOCK):
        kb, vb = k[start:start + BLOCK - 1], v[start:start + BLOCK - 1]
        s = (q @ kb.T).to(work) * scale
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ vb.to(work)
        m = m_new
    return (acc / l).to(q.dtype)


def inputs():
    return attention_inputs()
