"""Every op the sim chip lowers computes what the torch CPU driver computes, node by node, within the
tolerance of its dtype (layout ops, casts, fills and comparisons bit for bit)."""

import pytest
import torch

from hardware.drivers import open_driver
from hardware.drivers.sim.lowering import supported_ops
from tests.conftest import MODELS, program

OPS = str(MODELS / "sim_ops.py")
# Ops whose result is exactly defined: moving, casting, filling, comparing and selecting elements.
EXACT = ("view", "_unsafe_view", "transpose", "t", "permute", "expand", "slice", "select", "unsqueeze", "squeeze",
         "clone", "alias", "detach", "split", "split_with_sizes", "unbind", "cat", "slice_scatter", "copy", "repeat",
         "flip", "_to_copy", "ones", "zeros", "full", "ones_like", "zeros_like", "full_like", "scalar_tensor", "tril",
         "triu", "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not", "bitwise_not",
         "masked_fill", "where", "embedding", "index", "relu", "neg", "abs", "maximum", "minimum", "clamp_max",
         "clamp_min", "amax")


@pytest.fixture(scope="module")
def reference():
    """The ops model's every value as the torch driver computes it, and a sim driver with the model loaded."""
    p = program(OPS)
    torch_driver = open_driver("torch:cpu")
    values = dict(torch_driver.load(p))
    for node in p.nodes:
        args, kwargs = node.bind(values.__getitem__)
        values.update(zip(node.outputs, torch_driver.execute(node, args, kwargs)))
    sim = open_driver("sim")
    sim.load(p)
    return p, values, sim


def test_the_ops_model_runs_every_op_the_sim_chip_lowers():
    assert {n.op for n in program(OPS).nodes} == set(supported_ops())


@pytest.mark.parametrize("op", supported_ops())
def test_op_matches_the_torch_driver(reference, op):
    p, values, sim = reference
    nodes = [n for n in p.nodes if n.op == op]
    assert nodes
    for node in nodes:
        args, kwargs = node.bind(values.__getitem__)
        for name, got in zip(node.outputs, sim.execute(node, args, kwargs)):
            expected = values[name]
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            if op.split(".")[1] in EXACT:
                assert torch.equal(_bytes(got), _bytes(expected)), name
            else:
                torch.testing.assert_close(got.double(), expected.double(), rtol=_rtol(got.dtype), atol=1e-5,
                                           msg=lambda m: f"{node.describe()}: {m}")


def _rtol(dtype: torch.dtype) -> float:
    """The summation order differs (the sim chip reduces across cores): a few units in the last place."""
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 1e-5)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)
