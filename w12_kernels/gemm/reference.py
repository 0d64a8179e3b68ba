"""Readable reference for ``w12_linear``: decode each weight by the record's definition, then
multiply in float64.

Slow on purpose (a Python loop over escapes); tests compare the kernels and the fallback with it.
"""

from __future__ import annotations

import torch

from w12.tensor import W12Tensor


def reference_decode(w: W12Tensor) -> torch.Tensor:
    """The exact BF16 weight [N, K], written straight from the W12 record (format v1)."""
    n, k = w.shape
    h = w.hi.cpu().to(torch.int32)
    lo = w.lo.cpu().to(torch.int32)
    nibble = torch.stack((lo & 15, lo >> 4), dim=2).reshape(n, -1)[:, :k]
    sign, offset, top = h >> 7, (h >> 3) & 15, h & 7
    exponent = w.e0.cpu().to(torch.int32)[:, None] + offset
    bits = sign << 15 | exponent << 7 | top << 4 | nibble
    bits = bits.to(torch.int64)
    rowptr, cols, vals = w.esc_rowptr.cpu(), w.esc_col.cpu(), w.esc_val.cpu()
    for row in range(n):
        for p in range(int(rowptr[row]), int(rowptr[row + 1])):
            bits[row, int(cols[p])] = int(vals[p]) & 0xFFFF
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(torch.bfloat16)


def reference_linear(
    x: torch.Tensor, w: W12Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` in float64 on the CPU, from the exact BF16 weights."""
    weight = reference_decode(w).to(torch.float64)
    y = x.detach().cpu().to(torch.float64) @ weight.T
    if bias is not None:
        y = y + bias.detach().cpu().to(torch.float64)
    return y
