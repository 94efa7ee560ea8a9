"""The fix of blocked_attention.py: the accumulator is rescaled by alpha when the running max grows."""

import math

import torch

from reference import attention_inputs

BLOCK = 16


def blocked_attention(q, k, v):
    n, d = q.shape
    scale = 1.0 / math.sqrt(d)
    work = torch.promote_types(q.dtype, torch.float32)  # accumulate in float32 at least
    m = torch.full((n, 1), float("-inf"), dtype=work)
    l = torch.zeros(n, 1, dtype=work)
    acc = torch.zeros(n, v.shape[-1], dtype=work)
    for start in range(0, k.shape[0], BLOCK):
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
    return attention_inputs()
