"""A small GPT-style decoder: token embedding, attention + MLP blocks with layer norm.

Seeded random weights, so every run computes the same numbers. `build()` is the entry
Rewind loads: it returns the module and a tuple of example inputs.
"""

import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        q = q.view(batch, tokens, self.heads, -1).transpose(1, 2)
        k = k.view(batch, tokens, self.heads, -1).transpose(1, 2)
        v = v.view(batch, tokens, self.heads, -1).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, tokens, width)
        return self.proj(out)


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        hidden = torch.nn.functional.gelu(self.up(x))
        return self.down(hidden)


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, depth: int = 2, context: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return logits


def build(vocab: int = 64, width: int = 32, heads: int = 4, depth: int = 2, tokens: int = 16, batch: int = 1):
    torch.manual_seed(0)
    model = GPT(vocab, width, heads, depth, context=tokens)
    ids = torch.randint(0, vocab, (batch, tokens))
    return model, (ids,)
