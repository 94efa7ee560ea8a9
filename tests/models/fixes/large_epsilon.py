"""A wrong fix for tests/models/forensics/rsqrt_no_epsilon.py: an epsilon so large it changes the
normalisation of the nearly constant row (its variance is about 1e-9)."""

import torch


def rsqrt_plus_epsilon(variance):
    return torch.rsqrt(variance + 1e-3)


PATCHES = {"rsqrt": rsqrt_plus_epsilon}
