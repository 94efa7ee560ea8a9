"""A float16 model trained with Adam's default eps = 1e-8: float16 has no number that small, so eps rounds to 0, and
where a gradient is small its second moment (0.001 * g ** 2) underflows to 0 as well: the update divides by 0."""

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(6, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x, labels):
        return nn.functional.cross_entropy(self.out(torch.tanh(self.hidden(x))), labels)


def train_step():
    torch.manual_seed(0)
    model = Classifier().half()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8)  # BUG: 1e-8 is 0 in float16
    x, labels = torch.randn(16, 6).half(), torch.randint(0, 3, (16,))
    return model, (x, labels), optimizer
