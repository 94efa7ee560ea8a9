"""A fix file for rms_norm.py: the reciprocal square root of the mean square plus an epsilon.

rewind repair writes it into the model's source: the function and the constant it uses go in after
the model's imports, and the call replaces `torch.rsqrt(...)` at the line that made the node."""

import torch

EPSILON = 1e-6  # small beside any mean square a real row has


def rsqrt_plus_epsilon(mean_square):
    return torch.rsqrt(mean_square + EPSILON)


PATCHES = {"rsqrt": rsqrt_plus_epsilon}
