"""Blocked attention, accumulator rescaled, but the loop stops before a tail block of keys that is shorter than a
block.

Planted: `range(0, k.shape[0] - BLOCK + 1, BLOCK)` drops the last keys when their count is not a multiple of the
block; tail_block_fixed.py is the fix."""

import math

import torch

from reference import attention_inputs

BLOCK = 16


def tail_attention(q, k, v):
    n, d = q.shape
    scale = 1.0 / math.sqrt(d)
    work = torch.promote_types(q.dtype, torch.float32)  # accumulate in float32 at least
    m = torch.full((n, 1), float("-inf"), dtype=work)
    l = torch.zeros(n, 1, dtype=work)
    acc = torch.zeros(n, v.shape[-1], dtype=work)
    for start in range(0, k.shape[0] - BLOCK + 1, BLOCK):
        kb, vb = k[start:start + BLOCK], v[start:start + BLOCK]
        s = (q @ kb.T).to(work) * scale
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ vb.to(work)
        m = m_new
    return (acc / l).to(q.dtype)


def inputs():
    return attention_inputs(keys=60)
