"""Entries that fail in each way a user's file can fail."""

import torch
from torch import nn


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace this
            return x * 2
        return x


def returns_module_only():
    return nn.Linear(2, 2)


def returns_wrong_inputs():
    return nn.Linear(2, 2), "not a tuple"


def raises():
    raise ValueError("weights file missing")


def export_fails():
    return DataDependent(), (torch.randn(3),)


not_callable = 42
