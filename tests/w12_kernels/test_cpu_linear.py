"""The CPU linear (``w12_kernels.cpu_linear``) gives a row the same bits alone as among others:
the property speculative decoding on the CPU needs (a decode step has one row, a verify step
several). torch's own BF16 linear does not have it on every CPU: one row takes another kernel."""

from __future__ import annotations

import torch

from engine.model import Linear
from w12.tensor import encode
from w12_kernels.cpu_linear import linear
from w12_kernels.gemm import prepare_weight, w12_linear


def _case(n=576, k=1536, m=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16)
    return w, x, b


def _rows_alone_equal_rows_together(run, x) -> None:
    together = run(x)
    for m in (2, 7):
        assert torch.equal(run(x[:m]).view(torch.int16), together[:m].view(torch.int16))
    for i in range(x.shape[0]):
        alone = run(x[i:i + 1])
        assert torch.equal(alone.view(torch.int16), together[i:i + 1].view(torch.int16)), i


def test_dense_rows_do_not_depend_on_the_row_count():
    w, x, b = _case()
    _rows_alone_equal_rows_together(lambda v: linear(v, w, b), x)
    # leading dimensions kept, a single row of a [1, 1, K] input too
    assert linear(x[:1, None], w).shape == (1, 1, 576)
    assert torch.equal(linear(x[:3].view(3, 1, -1), w).view(3, -1), linear(x[:3], w))


def test_w12_and_engine_linears_on_the_cpu_too():
    w, x, b = _case(seed=1)
    packed = prepare_weight(encode(w))
    _rows_alone_equal_rows_together(lambda v: w12_linear(v, packed, b), x)
    layer = Linear(1536, 576)
    layer.weight, layer.bias = w, b
    _rows_alone_equal_rows_together(layer, x)
