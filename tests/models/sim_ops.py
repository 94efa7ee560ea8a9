"""One node of every op the sim chip lowers, for the op-by-op comparison with the torch driver.

Ops that torch.export only writes when asked are called through torch.ops.aten.
"""

import torch
from torch import nn

aten = torch.ops.aten


class Ops(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(12, 8) * 0.3)
        self.b = nn.Parameter(torch.randn(12) * 0.1)
        self.table = nn.Parameter(torch.randn(16, 8))
        self.ln = nn.LayerNorm(8)
        self.rms = nn.RMSNorm(8)

    def forward(self, x, ids, y):
        out = []
        # unary
        out += [torch.relu(x), torch.nn.functional.silu(x), torch.sigmoid(x), torch.exp(x), torch.tanh(x), -x,
                torch.rsqrt(x.abs() + 1), torch.sqrt(x.abs()), torch.nn.functional.gelu(x),
                torch.nn.functional.gelu(x, approximate="tanh")]
        mask = x > 0
        out += [~mask, aten.logical_not(mask)]
        # binary, with broadcasting
        row = x[0]
        out += [x + y, x - row, x * y, x / (y.abs() + 1), aten.add.Scalar(x, 2.0), aten.sub.Scalar(x, 1.5),
                aten.mul.Scalar(x, 3.0), aten.div.Scalar(x, 4.0), torch.add(x, y, alpha=2), 1.0 - x,
                torch.maximum(x, y), torch.minimum(x, y), x.abs() ** 1.5, y.abs() ** x.abs().clamp_max(2), x.clamp_min(0.1)]
        out += [x < y, x <= 0.5, x > y, x >= row, x == y, x != 0.0, aten.lt.Scalar(x, 0.1), aten.le.Tensor(x, y),
                aten.gt.Scalar(x, 0.2), aten.ge.Scalar(x, 0.0), aten.eq.Scalar(x, 0.0), aten.ne.Tensor(x, y),
                torch.logical_and(mask, y > 0), torch.logical_or(mask, y > 0)]
        # selection, casts, triangles, fills
        out += [x.masked_fill(mask, -1.0), x.masked_fill(mask, y[0, 0]), torch.where(mask, x, y)]
        out += [x.to(torch.bfloat16), x.to(torch.float16), (x * 100).to(torch.float8_e4m3fn).to(torch.float32),
                x.to(torch.float8_e5m2), x.to(torch.bfloat16).to(torch.float32) * 2, ids.to(torch.float32)]
        out += [torch.tril(x), torch.triu(x, 1), torch.ones(3, 5), torch.zeros(2, 3), torch.full((2, 2), 7.0),
                torch.ones_like(x), torch.zeros_like(x), torch.full_like(x, 0.5), aten.scalar_tensor(3.0)]
        # layout
        cube = x.reshape(2, 2, 8)
        parts = x.split(3)
        out += [x.view(8, 4), aten._unsafe_view(x, [2, 16]), aten.reshape(x, [32]), x.transpose(0, 1), x.t(),
                cube.permute(2, 0, 1), row.expand(3, 8), x[1:3], x[:, ::2], x.select(1, 2), x.unsqueeze(1),
                x.unsqueeze(0).squeeze(0), aten.squeeze.dims(cube.unsqueeze(1), [1]), aten.squeeze.default(x[None]),
                x.t().contiguous(), aten.alias(x), aten.detach(x), parts[0], parts[1],
                *x.split_with_sizes([1, 3], 0), *x.chunk(2, 1), *x.unbind(0), torch.cat([x, y], 1),
                aten.slice_scatter(x, y[:2], 0, 1, 3), aten.copy(x, row), x.flatten(), aten.unflatten(x, 1, [2, 4]),
                x.narrow(1, 2, 3), x.repeat(2, 1), x.flip(1)]
        # rows
        out += [torch.softmax(x, -1), torch.log_softmax(x, -1), aten._softmax(x, -1, False),
                aten._log_softmax(x, -1, False), self.ln(x), self.rms(x), x.sum(-1), x.mean(-1, keepdim=True),
                x.amax(-1), aten.sum.default(x), aten.mean.default(x), cube.sum([1, 2])]
        # products and lookups
        out += [nn.functional.linear(x, self.w, self.b), x @ self.w.t(), torch.mm(x, self.w.t()),
                torch.bmm(cube, cube.transpose(1, 2)), torch.addmm(self.b, x, self.w.t()),
                cube @ self.w.t(), nn.functional.linear(x, self.w), self.table[ids] * 1.0,
                nn.functional.embedding(ids, self.table)]
        return tuple(out)


def build():
    torch.manual_seed(0)
    return Ops(), (torch.randn(4, 8), torch.tensor([3, 0, 15, 7]), torch.randn(4, 8))
