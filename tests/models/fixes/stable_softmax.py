"""A fix for tests/models/forensics/softmax_overflow.py: exp of the scores less their row max."""

import torch


def stable_exp(scores):
    return torch.exp(scores - scores.amax(-1, keepdim=True))


PATCHES = {"exp": stable_exp}
