"""A readable, loop-based reference encoder/decoder of W12 v1, written straight from FORMAT.md.

Slow on purpose: it exists so that the fast codecs can be checked plane by plane against code
that anyone can read in a minute.
"""

from __future__ import annotations

import numpy as np

from w12 import spec


def encode_row(bits: list[int]) -> tuple[int, list[int], list[int], list[tuple[int, int]]]:
    """One row of BF16 bit patterns -> (e0, hi bytes, lo nibbles, [(column, bits) escapes])."""
    counts = [0] * 256
    for b in bits:
        exponent = (b >> 7) & 0xFF
        if 1 <= exponent <= 254:
            counts[exponent] += 1
    best_e0, best = spec.E0_MIN, -1
    for e0 in range(spec.E0_MIN, spec.E0_MAX + 1):
        covered = sum(counts[e0 : e0 + spec.WINDOW_BINADES])
        if covered > best:  # strict: ties keep the lowest e0
            best_e0, best = e0, covered
    hi, nibbles, escapes = [], [], []
    for col, b in enumerate(bits):
        sign, exponent, mantissa = b >> 15, (b >> 7) & 0xFF, b & 0x7F
        offset = exponent - best_e0
        if 0 <= offset < spec.WINDOW_BINADES:
            record = sign << 11 | offset << 7 | mantissa
            hi.append(record >> 4)
            nibbles.append(record & 15)
        else:
            hi.append(0)
            nibbles.append(0)
            escapes.append((col, b))
    return best_e0, hi, nibbles, escapes


def encode(bits: np.ndarray) -> tuple[np.ndarray, ...]:
    """uint16 [N, K] -> (hi, lo, e0, rowptr, col, val) with the canonical dtypes."""
    n, k = bits.shape
    hi = np.zeros((n, k), np.uint8)
    lo = np.zeros((n, spec.lo_width(k)), np.uint8)
    e0 = np.zeros(n, np.uint8)
    rowptr, cols, vals = [0], [], []
    for row in range(n):
        e0[row], hi_row, nibbles, escapes = encode_row([int(b) for b in bits[row]])
        hi[row] = hi_row
        for col, nib in enumerate(nibbles):
            lo[row, col // 2] |= nib << (4 * (col % 2))
        cols += [c for c, _ in escapes]
        vals += [v for _, v in escapes]
        rowptr.append(len(cols))
    return (
        hi,
        lo,
        e0,
        np.array(rowptr, np.int64),
        np.array(cols, np.int32),
        np.array(vals, np.uint16).view(np.int16),
    )


def decode(hi, lo, e0, rowptr, col, val) -> np.ndarray:
    """Planes -> uint16 [N, K] BF16 bit patterns."""
    n, k = hi.shape
    out = np.zeros((n, k), np.uint16)
    for row in range(n):
        for j in range(k):
            record = int(hi[row, j]) << 4 | (int(lo[row, j // 2]) >> (4 * (j % 2))) & 15
            sign, offset, mantissa = record >> 11, (record >> 7) & 15, record & 0x7F
            out[row, j] = sign << 15 | (int(e0[row]) + offset) << 7 | mantissa
        for p in range(rowptr[row], rowptr[row + 1]):
            out[row, col[p]] = np.uint16(np.int16(val[p]).view(np.uint16))
    return out
