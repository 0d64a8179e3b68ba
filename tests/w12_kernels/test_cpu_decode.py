"""The numba CPU decode of the kernel layout gives the source bits, like the torch decode."""

import numpy as np
import pytest
import torch

import w12
from w12_kernels.gemm import prepare_weight
from w12_kernels.gemm.decode.cpu import decode_packed_cpu
from w12_kernels.gemm.layout import decode_packed


@pytest.mark.parametrize("shape", [(1, 1), (3, 257), (130, 576), (17, 8)])
def test_cpu_decode_matches_source_and_torch_decode(shape):
    rng = np.random.default_rng(sum(shape))
    bits = rng.integers(0, 65536, shape).astype(np.uint16)  # every kind of escape, any window
    bits[: shape[0] // 2] = (
        torch.from_numpy(rng.standard_normal((shape[0] // 2, shape[1])) * 0.02)
        .bfloat16().view(torch.int16).numpy().view(np.uint16)
    )
    t = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    pw = prepare_weight(w12.encode(t))
    args = (pw.chunks, pw.e0, pw.esc_rowptr, pw.esc_col, pw.esc_val, pw.n, pw.k)
    fast = decode_packed_cpu(*args)
    assert torch.equal(fast.view(torch.int16), t.view(torch.int16))
    assert torch.equal(fast.view(torch.int16), decode_packed(*args).view(torch.int16))
