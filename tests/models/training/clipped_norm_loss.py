"""A regression whose loss is a norm (torch.linalg.vector_norm of the residual), its gradients clipped to a total
norm of 0.5 (`torch.nn.utils.clip_grad_norm_` in an eager loop: the "clip_grad_norm" of the step's options), SGD
with momentum; the parameter `unused` is reached by no loss, and like `opt.zero_grad(set_to_none=True)` leaves it,
it has no gradient and is not updated, weight decay or not."""

import torch
from torch import nn

MAX_NORM = 0.5


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.fit = nn.Linear(6, 2)
        self.unused = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.fit(x)


def residual_norm(out, target):
    return torch.linalg.vector_norm(out - target, 2)


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(10, 6, generator=g) * 3
    return x, x[:, :2] * 4 - 1


def train_step():
    torch.manual_seed(0)
    model = Regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    return model, _batch(0), residual_norm, optimizer, {"clip_grad_norm": MAX_NORM}


def batches():
    for seed in range(100):
        yield _batch(seed)
