"""The CPU codec: numba kernels, parallel over rows.

Encoding makes two passes over each row while it sits in cache: an exponent histogram that picks
``e0``, then the records. Escape positions are counted in the first pass so that row pointers are a
prefix sum and the second pass writes every row's escapes straight into place, with no locks and no
dependence on thread count: the output is deterministic.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from w12 import spec
from w12.tensor import W12Tensor

_W = spec.WINDOW_BINADES


@numba.njit(cache=True, inline="always")
def _pick_e0(hist):
    """Lowest e0 in [E0_MIN, E0_MAX] whose 16-binade window holds the most counted values."""
    window = 0
    for e in range(spec.E0_MIN, spec.E0_MIN + _W):
        window += hist[e]
    best, best_e0 = window, spec.E0_MIN
    for e0 in range(spec.E0_MIN + 1, spec.E0_MAX + 1):
        window += hist[e0 + _W - 1] - hist[e0 - 1]
        if window > best:
            best, best_e0 = window, e0
    return best_e0


@numba.njit(cache=True, parallel=True)
def _encode_records(bits, hi, lo, e0_out, esc_count):
    n, k = bits.shape
    for row in numba.prange(n):
        hist = np.zeros(256, np.int64)
        for j in range(k):
            hist[(bits[row, j] >> 7) & 0xFF] += 1
        # exponents 0 (zero/subnormal) and 255 (inf/NaN) never count towards a window
        hist[0] = 0
        hist[255] = 0
        e0 = _pick_e0(hist)
        e0_out[row] = e0
        escapes = 0
        for j in range(0, k - 1, 2):
            b0 = bits[row, j]
            b1 = bits[row, j + 1]
            off0 = ((b0 >> 7) & 0xFF) - e0
            off1 = ((b1 >> 7) & 0xFF) - e0
            if 0 <= off0 < _W:
                hi[row, j] = ((b0 >> 8) & 0x80) | (off0 << 3) | ((b0 >> 4) & 7)
                n0 = b0 & 15
            else:
                hi[row, j] = 0
                n0 = 0
                escapes += 1
            if 0 <= off1 < _W:
                hi[row, j + 1] = ((b1 >> 8) & 0x80) | (off1 << 3) | ((b1 >> 4) & 7)
                n1 = b1 & 15
            else:
                hi[row, j + 1] = 0
                n1 = 0
                escapes += 1
            lo[row, j >> 1] = n0 | (n1 << 4)
        if k & 1:
            j = k - 1
            b0 = bits[row, j]
            off0 = ((b0 >> 7) & 0xFF) - e0
            if 0 <= off0 < _W:
                hi[row, j] = ((b0 >> 8) & 0x80) | (off0 << 3) | ((b0 >> 4) & 7)
                lo[row, j >> 1] = b0 & 15
            else:
                hi[row, j] = 0
                lo[row, j >> 1] = 0
                escapes += 1
        esc_count[row] = escapes


@numba.njit(cache=True, parallel=True)
def _collect_escapes(bits, e0, rowptr, col, val):
    n, k = bits.shape
    for row in numba.prange(n):
        pos = rowptr[row]
        if pos == rowptr[row + 1]:
            continue
        base = e0[row]
        for j in range(k):
            off = ((bits[row, j] >> 7) & 0xFF) - base
            if off < 0 or off >= _W:
                col[pos] = j
                val[pos] = bits[row, j]
                pos += 1


@numba.njit(cache=True, parallel=True)
def _decode(hi, lo, e0, rowptr, col, val, out):
    n, k = hi.shape
    for row in numba.prange(n):
        exp_base = np.uint16(e0[row]) << 7
        for j in range(k):
            h = np.uint16(hi[row, j])
            nib = (np.uint16(lo[row, j >> 1]) >> ((j & 1) * 4)) & 15
            out[row, j] = ((h & 0x80) << 8) | (exp_base + ((h & 0x78) << 4)) | ((h & 7) << 4) | nib
        for p in range(rowptr[row], rowptr[row + 1]):
            out[row, col[p]] = val[p]


def encode_numpy(bits: np.ndarray) -> tuple[np.ndarray, ...]:
    """Encode BF16 bit patterns (uint16 [N, K]) into (hi, lo, e0, rowptr, col, val) numpy arrays."""
    n, k = bits.shape
    hi = np.empty((n, k), np.uint8)
    lo = np.empty((n, spec.lo_width(k)), np.uint8)
    e0 = np.empty(n, np.uint8)
    counts = np.empty(n, np.int64)
    _encode_records(bits, hi, lo, e0, counts)
    rowptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=rowptr[1:])
    total = int(rowptr[-1])
    col = np.empty(total, np.int32)
    val = np.empty(total, np.uint16)
    if total:
        _collect_escapes(bits, e0, rowptr, col, val)
    return hi, lo, e0, rowptr, col, val.view(np.int16)


def decode_numpy(hi, lo, e0, rowptr, col, val) -> np.ndarray:
    """Decode numpy planes back to BF16 bit patterns (uint16 [N, K])."""
    out = np.empty(hi.shape, np.uint16)
    _decode(hi, lo, e0, rowptr, col, val.view(np.uint16), out)
    return out


def encode(t: torch.Tensor) -> W12Tensor:
    bits = t.view(torch.int16).numpy().view(np.uint16)
    arrays = encode_numpy(bits)
    return W12Tensor(*(torch.from_numpy(a) for a in arrays))


def decode(w: W12Tensor) -> torch.Tensor:
    out = decode_numpy(*(getattr(w, f).numpy() for f in _FIELDS))
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)


_FIELDS = ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val")
