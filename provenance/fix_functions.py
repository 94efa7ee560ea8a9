"""Replacement implementations the built-in fix recipes put in place of an op (provenance/recipes.py).

Each is called with the node's arguments as the op receives them and computes from them alone:
this module imports nothing but torch, so the repair loop's integrity check reads it like any
fixer's file, and a validated fix built from it is recorded in the knowledge base as this text.
"""

import torch

EPSILON = 1e-5  # what layer norms add to a variance


def exp_minus_row_max(x):
    """exp(x - max(x)) along the last dim: it cannot overflow, and a normalisation after it cancels the shift."""
    return torch.exp(x - x.amax(-1, keepdim=True))


def rsqrt_with_epsilon(x):
    return torch.rsqrt(x + EPSILON)


def reciprocal_with_epsilon(x):
    return torch.reciprocal(x + EPSILON)


def div_by_nonzero(a, b):
    return a / torch.where(b == 0, torch.full_like(b, EPSILON), b)


def log_clamped(x):
    return torch.log(x.clamp_min(torch.finfo(x.dtype).tiny))


def log_softmax_for_softmax(x, dim, *rest):
    """log(softmax(x)) as log_softmax(x): a probability that underflows to 0 has a finite log, not -inf."""
    return torch.log_softmax(x, dim)


def log_sigmoid_of_negated(z):
    """log(1 - sigmoid(z)) as logsigmoid(-z): 1 - sigmoid(z) rounds to 0 for large z; its log is about -z."""
    return torch.nn.functional.logsigmoid(-z)


def log_sigmoid(z):
    """log(sigmoid(z)) as logsigmoid(z): sigmoid(z) underflows to 0 for very negative z; its log is about z."""
    return torch.nn.functional.logsigmoid(z)


def log_already_taken(x, *rest):
    """A node between a stable log form and the log it replaces: its argument already is the log."""
    return x


def sqrt_clamped(x):
    return torch.sqrt(x.clamp_min(0.0))


def rsqrt_clamped(x):
    return torch.rsqrt(x.clamp_min(torch.finfo(x.dtype).tiny))


def softmax_zero_masked_rows(x, dim, *rest):
    """softmax, with the rows whose every element is -inf (nothing to attend to) set to zero instead of NaN."""
    empty = torch.isneginf(x).all(dim, keepdim=True)
    return torch.softmax(x.masked_fill(empty, 0.0), dim).masked_fill(empty, 0.0)


def div_where_gradient_is_zero(grad, x):
    """grad / x, with x taken as 1 where the gradient passed back is 0: there a `where` discarded the forward's
    value, and the backward of the double where (log(where(x > 0, x, 1))) divides by 1, not by the 0 it masked."""
    return grad / torch.where(grad == 0, 1.0, x)


def sqrt_with_epsilon(x):
    """sqrt(x + tiny): the same roots wherever x is a normal number, and a finite gradient where x is 0."""
    return torch.sqrt(x + torch.finfo(x.dtype).tiny)
