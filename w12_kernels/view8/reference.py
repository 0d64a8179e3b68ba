"""Readable float64 statement of the 8-bit view, element by element (tests compare the
vectorised view with it)."""

from __future__ import annotations

import math

import torch

from w12.tensor import W12Tensor


def view_value(hi: int, e0: int) -> float:
    """The view of one in-window record's high byte ``hi`` in a row of base exponent ``e0``."""
    sign = -1.0 if hi >> 7 else 1.0
    offset, top = (hi >> 3) & 15, hi & 7
    return sign * math.ldexp(1.0 + (top + 0.5) / 8.0, e0 + offset - 127)


def reference_view(w: W12Tensor) -> torch.Tensor:
    """The view [N, K] in float64: escapes exact, everything else from the high byte."""
    n, k = w.shape
    hi, e0 = w.hi.cpu().tolist(), w.e0.cpu().tolist()
    out = torch.empty(n, k, dtype=torch.float64)
    for row in range(n):
        for col in range(k):
            out[row, col] = view_value(hi[row][col], e0[row])
    rowptr, cols = w.esc_rowptr.cpu().tolist(), w.esc_col.cpu().tolist()
    vals = w.esc_val.cpu()
    for row in range(n):
        for p in range(rowptr[row], rowptr[row + 1]):
            out[row, cols[p]] = float(vals[p:p + 1].view(torch.bfloat16).double())
    return out
