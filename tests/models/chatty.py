"""A model that prints while it is built and traced: its output must never reach the DAP stream."""

import torch
from torch import nn


class Chatty(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        print("Content-Length: 5\r\n\r\nhello from forward")
        return torch.relu(self.fc(x))


def build():
    print("building the chatty model")
    torch.manual_seed(0)
    return Chatty(), (torch.randn(2, 4),)
