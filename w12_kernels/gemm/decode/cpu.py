"""Numba decode of the kernel-layout chunks, for the CPU path of ``w12_linear``.

The torch version in ``layout.unpack_bits`` builds several int64 temporaries per weight and is
about 20x slower than this loop on a 2-core machine, which made every CPU decode step of the
engine take seconds. Same bits, checked against ``layout.decode_packed`` in the tests.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from w12_kernels.gemm.layout import B_POSITIONS

_POSITIONS = np.array(B_POSITIONS, np.int64)  # [8, 4]: sign, eoff3, eoff2, eoff1 bit of weight i


@numba.njit(cache=True, parallel=True)
def _unpack(chunks, e0, positions, rowptr, col, val, out):
    n, k = out.shape
    tiles, nchunks, _ = chunks.shape
    for tile in numba.prange(tiles):
        for c in range(nchunks):
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for j in range(4):
                    w0 = np.int64(chunks[tile, c, lane * 4 + j]) & 0xFFFFFFFF
                    w1 = np.int64(chunks[tile, c, 128 + lane * 4 + j]) & 0xFFFFFFFF
                    top = np.int64(chunks[tile, c, 256 + lane * 4 + j]) & 0xFFFFFFFF
                    for i in range(8):
                        row = tile * 16 + g + 8 * ((i >> 1) & 1)
                        cc = c * 64 + 16 * t + 4 * j + 2 * (i >> 2) + (i & 1)
                        if row >= n or cc >= k:
                            continue
                        word = w0 if i < 4 else w1
                        low = (word >> (8 * (i & 3))) & 255
                        sign = (top >> positions[i, 0]) & 1
                        eoff = ((top >> positions[i, 1]) & 1) << 3
                        eoff |= ((top >> positions[i, 2]) & 1) << 2
                        eoff |= ((top >> positions[i, 3]) & 1) << 1 | (low >> 7)
                        out[row, cc] = sign << 15 | (np.int64(e0[row]) + eoff) << 7 | (low & 0x7F)
    for row in numba.prange(n):
        for p in range(rowptr[row], rowptr[row + 1]):
            out[row, col[p]] = val[p]


def decode_packed_cpu(chunks, e0, esc_rowptr, esc_col, esc_val, n: int, k: int) -> torch.Tensor:
    """The exact BF16 weight [n, k] from CPU kernel-layout chunks."""
    out = np.empty((n, k), np.uint16)
    _unpack(chunks.numpy(), e0.numpy(), _POSITIONS, esc_rowptr.numpy(), esc_col.numpy(),
            esc_val.numpy().view(np.uint16), out)
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
