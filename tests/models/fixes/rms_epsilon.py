"""The fix for tests/models/repair/rms_norm_no_eps.py: an epsilon under the mean square, so a zero row
normalises to 0 (and the bias after it) instead of 0 * Inf."""

import torch


def rsqrt_with_epsilon(mean_square):
    return torch.rsqrt(mean_square + 1e-6)


PATCHES = {"rsqrt": rsqrt_with_epsilon}
