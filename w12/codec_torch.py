"""The torch codec: vectorised tensor ops that run on any device (the GPU path of encode/decode).

It computes exactly what the numba codec computes (the tests compare the two plane by plane).
Work is done in row chunks so the int32 temporaries stay bounded on large weights. Exponent
histograms come from ``scatter_add``; the window argmax relies on ``torch.argmax`` returning the
first maximum, which is the format's lowest-e0 tie rule.
"""

from __future__ import annotations

import torch

from w12 import spec
from w12.tensor import W12Tensor

_CHUNK_ELEMENTS = 1 << 25


def _row_chunks(n: int, k: int):
    step = max(1, _CHUNK_ELEMENTS // max(k, 1))
    for start in range(0, n, step):
        yield start, min(n, start + step)


def _pick_e0(exponent: torch.Tensor) -> torch.Tensor:
    counted = ((exponent >= 1) & (exponent <= 254)).to(torch.int32)
    hist = torch.zeros(exponent.shape[0], 256, dtype=torch.int32, device=exponent.device)
    hist.scatter_add_(1, exponent.long(), counted)
    cum = hist.cumsum(1)
    # window [e0, e0 + 15] for e0 = 1..239 holds cum[e0 + 15] - cum[e0 - 1] values
    lo, hi, width = spec.E0_MIN, spec.E0_MAX, spec.WINDOW_BINADES
    window = cum[:, lo + width - 1 : hi + width] - cum[:, lo - 1 : hi]
    return window.argmax(dim=1).to(torch.int32) + spec.E0_MIN


def _encode_chunk(bits: torch.Tensor):
    exponent = (bits >> 7) & 0xFF
    e0 = _pick_e0(exponent)
    offset = exponent - e0[:, None]
    in_window = (offset >= 0) & (offset < spec.WINDOW_BINADES)
    hi = ((bits >> 8) & 0x80) | (offset << 3) | ((bits >> 4) & 7)
    hi = torch.where(in_window, hi, 0).to(torch.uint8)
    nib = torch.where(in_window, bits & 15, 0)
    if nib.shape[1] % 2:
        nib = torch.nn.functional.pad(nib, (0, 1))
    lo = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8)
    escape = ~in_window
    cols = escape.nonzero()[:, 1].to(torch.int32)
    vals = bits.masked_select(escape)
    return hi, lo, e0.to(torch.uint8), escape.sum(1), cols, vals


def encode(t: torch.Tensor) -> W12Tensor:
    n, k = t.shape
    bits_all = t.view(torch.int16)
    parts = [_encode_chunk(bits_all[a:b].to(torch.int32) & 0xFFFF) for a, b in _row_chunks(n, k)]
    parts = parts or [_encode_chunk(bits_all.to(torch.int32))]  # N == 0
    hi, lo, e0, counts, cols, vals = (torch.cat([p[i] for p in parts]) for i in range(6))
    rowptr = torch.zeros(n + 1, dtype=torch.int64, device=t.device)
    torch.cumsum(counts, 0, out=rowptr[1:])
    vals = (vals - ((vals >> 15) << 16)).to(torch.int16)  # uint16 bit pattern -> int16
    return W12Tensor(hi, lo, e0, rowptr, cols, vals)


def decode(w: W12Tensor) -> torch.Tensor:
    n, k = w.shape
    out = torch.empty(n, k, dtype=torch.int16, device=w.device)
    for a, b in _row_chunks(n, k):
        h = w.hi[a:b].to(torch.int32)
        lo = w.lo[a:b].to(torch.int32)
        nib = torch.stack((lo & 15, lo >> 4), dim=2).reshape(b - a, -1)[:, :k]
        e0 = w.e0[a:b].to(torch.int32)[:, None]
        bits = ((h & 0x80) << 8) | ((e0 + ((h >> 3) & 15)) << 7) | ((h & 7) << 4) | nib
        out[a:b] = (bits - ((bits >> 15) << 16)).to(torch.int16)
    if w.num_escapes:
        counts = w.esc_rowptr[1:] - w.esc_rowptr[:-1]
        rows = torch.repeat_interleave(torch.arange(n, device=w.device), counts)
        out[rows, w.esc_col.long()] = w.esc_val
    return out.view(torch.bfloat16)
