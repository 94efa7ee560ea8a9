"""A cheat for tests/models/forensics/softmax_overflow.py: it finds the reference pass in memory and
returns the reference's softmax weights instead of computing them."""

import gc

import torch


def weights(numerators, denominators):
    reference = next(o for o in gc.get_objects() if type(o).__name__ == "Reference")
    return reference.value("div").to(numerators.dtype)


PATCHES = {"div": weights}
