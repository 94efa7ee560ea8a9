"""A classifier trained with AdamW over 4 micro-batches a step (gradient accumulation): each micro-batch's loss is
divided by 4 and its gradient added to the others' before one update, as `loss.backward()` on each and one
`optimizer.step()` do. batches() yields the micro-batches in turn."""

import torch
from torch import nn

ACCUMULATE = 4


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(5, 16)
        self.l2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


def loss_fn(logits, labels):
    return nn.functional.cross_entropy(logits, labels) / ACCUMULATE


def _micro_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 5, generator=g), torch.randint(0, 3, (4,), generator=g)


def train_step():
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    return model, _micro_batch(0), loss_fn, optimizer, {"accumulate": ACCUMULATE}


def batches():
    for seed in range(1000):
        yield _micro_batch(seed)
