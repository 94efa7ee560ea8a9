"""A "kernel" that tiles the queries and hands each tile to torch's own scaled_dot_product_attention: a wrapper
of the operator it claims to replace, refused before anything is measured."""

import torch

from reference import attention_inputs
import torch.nn.functional as F

BLOCK = 16


def tiled_attention(q, k, v):
    rows = []
    for start in range(0, q.shape[0], BLOCK):
        rows.append(F.scaled_dot_product_attention(q[start:start + BLOCK], k, v))
    return torch.cat(rows)


def inputs():
    return attention_inputs()
