"""examples/gpt.py's GPT as a training step: next-token prediction, AdamW.

`train_step()` is the entry Rewind loads for training (launch with `"entry": "train_step"`, and `"steps": N` for N
steps one after another): it returns the module, its inputs then the target, the loss function and the optimizer.
`batches()` gives each step its own batch of tokens. Seeded, so every run computes the same numbers.
"""

import torch
from torch import nn

from gpt import GPT  # examples/gpt.py: Rewind runs a model file with its folder on the import path


def _batch(seed: int, vocab: int = 64, tokens: int = 16, batch: int = 2):
    """Tokens and the tokens that follow them."""
    ids = torch.randint(0, vocab, (batch, tokens + 1), generator=torch.Generator().manual_seed(seed))
    return ids[:, :-1], ids[:, 1:]


def next_token_loss(logits, targets):
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_step():
    torch.manual_seed(0)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return model, _batch(0), next_token_loss, optimizer


def batches():
    seed = 0
    while True:
        yield _batch(seed)
        seed += 1
