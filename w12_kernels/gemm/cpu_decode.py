"""Numba decode of the kernel-layout planes, for the CPU path of ``w12_linear``.

The torch version in ``layout.unpack_bits`` builds several int64 temporaries per weight and is
about 20x slower than this loop on a 2-core machine, which made every CPU decode step of the
engine take seconds. Same bits, checked against ``layout.decode_packed`` in the tests.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from w12_kernels.gemm.layout import B_POSITIONS

_POSITIONS = np.array(B_POSITIONS, np.int64)  # [8, 4]: sign, eoff3, eoff2, eoff1 bit of column j


@numba.njit(cache=True, parallel=True)
def _unpack(planes, e0, positions, rowptr, col, val, out):
    n, k = out.shape
    for row in numba.prange(n):
        base = np.int64(e0[row])
        for c in range(k):
            g, j = c >> 3, c & 7
            low = (np.int64(planes[j >> 2, row, g]) >> (8 * (j & 3))) & 255
            word = np.int64(planes[2, row, g]) & 0xFFFFFFFF
            sign = (word >> positions[j, 0]) & 1
            eoff = ((word >> positions[j, 1]) & 1) << 3 | ((word >> positions[j, 2]) & 1) << 2
            eoff |= ((word >> positions[j, 3]) & 1) << 1 | (low >> 7)
            out[row, c] = sign << 15 | (base + eoff) << 7 | (low & 0x7F)
        for p in range(rowptr[row], rowptr[row + 1]):
            out[row, col[p]] = val[p]


def decode_packed_cpu(planes, e0, esc_rowptr, esc_col, esc_val, n: int, k: int) -> torch.Tensor:
    """The exact BF16 weight [n, k] from CPU kernel-layout planes."""
    out = np.empty((n, k), np.uint16)
    _unpack(planes.numpy(), e0.numpy(), _POSITIONS, esc_rowptr.numpy(), esc_col.numpy(),
            esc_val.numpy().view(np.uint16), out)
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
