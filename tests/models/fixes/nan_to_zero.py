"""A masking fix for tests/models/repair/rms_norm_no_eps.py: the NaN the norm's padding row is born with
(rsqrt(0) is Inf, 0 * Inf is NaN) replaced by 0 at the output. It hides the NaN, it does not prevent it."""

import torch


def output_without_nan(normed, bias):
    return torch.nan_to_num(normed + bias, nan=0.0)


PATCHES = {"add": output_without_nan}
