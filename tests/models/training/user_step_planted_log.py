"""Planted bug in a step of the user's own: the loss takes the log of softmax's probabilities, which underflow to
0 for logits this far apart, so the loss is Inf and its backward NaN (F.log_softmax, or cross_entropy, keeps it
finite). The step is written as users write one: zero_grad, backward, clip, step."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 3)
with torch.no_grad():
    model.weight.mul_(40.0)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(x, labels):
    opt.zero_grad()
    probs = torch.softmax(model(x), dim=-1)
    picked = probs.gather(1, labels[:, None])
    loss = -torch.log(picked).mean()  # BUG: log of an underflowed probability
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def batches():
    g = torch.Generator().manual_seed(3)
    while True:
        yield torch.randn(8, 4, generator=g) * 4, torch.randint(0, 3, (8,), generator=g)
