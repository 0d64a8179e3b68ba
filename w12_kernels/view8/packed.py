"""The 8-bit view of a W12 weight in the layout its GEMM reads (``prepare_view``, at load time).

The view GEMM reads one byte per weight: the W12 record's high byte, row-major as the format
stores it (``W12Tensor.hi``), each row padded to a multiple of ``COL_ALIGN`` bytes so that every
row starts 64-byte aligned. A kernel turns a high byte ``h`` into the BF16 bits

    (h & 0x80) << 8 | (h & 0x7F) << 4 | 0x3800 | MIDPOINT_NIBBLE

which is the view's value times ``2^(DECODE_BIAS - e0)`` (exponent field ``0b0111_eoff``, the
same trick as the exact GEMM's decode), and multiplies each output row by ``scale = 2^(e0 -
DECODE_BIAS)`` after the dot product. An escape's record is 0, whose view is ``1.0625 x 2^(e0 -
127)``; the epilogue adds ``x[m, col] x delta`` with ``delta = v - 1.0625 x 2^(e0 - 127)`` (float32)
so that the escape counts with its exact value ``v``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from w12.errors import W12Error
from w12.tensor import W12Tensor

DECODE_BIAS = 112  # as w12_kernels.gemm.layout: bits 14..11 of every decoded value are 0111
COL_ALIGN = 64  # bytes of a padded row of the high plane
MIDPOINT_NIBBLE = 8  # the low mantissa nibble the view assumes for every in-window weight
RECORD0_VIEW = 1.0 + (0 + MIDPOINT_NIBBLE / 16) / 8  # the view of record 0 in units of 2^(e0-127)


@dataclass(frozen=True)
class PackedView8:
    """The view of a W12 weight ``W [N, K]`` for :func:`view8_linear`; make it with
    :func:`prepare_view`.

    ``hi``: uint8 [N, Kp] (Kp = K rounded up to ``COL_ALIGN``; the padding is record 0);
    ``scale``: float32 [N] (2^(e0 - DECODE_BIAS)); ``e0``: uint8 [N]; ``esc_rowptr``: int32
    [N + 1]; ``esc_col``: int32 [E]; ``esc_val``: int16 [E] (the escapes' BF16 bits);
    ``esc_delta``: float32 [E] (module docstring).
    """

    n: int
    k: int
    hi: torch.Tensor
    scale: torch.Tensor
    e0: torch.Tensor
    esc_rowptr: torch.Tensor
    esc_col: torch.Tensor
    esc_val: torch.Tensor
    esc_delta: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.hi.device

    @property
    def num_escapes(self) -> int:
        return int(self.esc_col.numel())

    @property
    def nbytes(self) -> int:
        """Bytes the kernels hold for this weight (high plane, scales, escapes)."""
        return sum(t.numel() * t.element_size() for t in
                   (getattr(self, f.name) for f in fields(self)) if isinstance(t, torch.Tensor))

    def to(self, device: torch.device | str) -> PackedView8:
        return PackedView8(**{f.name: (v.to(device) if isinstance(v, torch.Tensor) else v)
                              for f in fields(self) for v in (getattr(self, f.name),)})

    def bits(self) -> torch.Tensor:
        """The view's BF16 bit patterns [N, K] as int16 (``w12_kernels.view8.view_bits``)."""
        return view_bits_of(self.hi[:, :self.k], self.e0, self.esc_rowptr, self.esc_col,
                            self.esc_val)


def view_bits_of(hi: torch.Tensor, e0: torch.Tensor, esc_rowptr: torch.Tensor,
                 esc_col: torch.Tensor, esc_val: torch.Tensor) -> torch.Tensor:
    """The view's BF16 bit patterns [N, K] (int16) from the high plane ``hi`` [N, K], the row
    bases ``e0`` [N] and the escape list (row pointers, columns, BF16 bits)."""
    h = hi.to(torch.int32)
    sign, offset, top = h >> 7, (h >> 3) & 15, h & 7
    exponent = e0.to(torch.int32)[:, None] + offset
    bits = sign << 15 | exponent << 7 | top << 4 | MIDPOINT_NIBBLE
    if esc_col.numel():
        n = hi.shape[0]
        counts = (esc_rowptr[1:] - esc_rowptr[:-1]).long()
        rows = torch.repeat_interleave(torch.arange(n, device=hi.device), counts)
        bits[rows, esc_col.long()] = esc_val.to(torch.int32) & 0xFFFF
    return (bits - ((bits >> 15) << 16)).to(torch.int16)


def prepare_view(w: W12Tensor, *, device: torch.device | str | None = None) -> PackedView8:
    """The view of ``w`` in the view GEMM's layout (once, at load time; ``device`` moves it).
    Raises ``W12Error`` for a malformed tensor."""
    if not isinstance(w, W12Tensor):
        raise W12Error(f"prepare_view expects a W12Tensor, got {type(w).__name__}")
    w.validate("weight")
    if device is not None:
        w = w.to(device)
    n, k = w.shape
    kp = -(-max(k, 1) // COL_ALIGN) * COL_ALIGN
    hi = torch.zeros((n, kp), dtype=torch.uint8, device=w.device)
    hi[:, :k] = w.hi
    e0 = w.e0.to(torch.float64)
    counts = (w.esc_rowptr[1:] - w.esc_rowptr[:-1]).long()
    rows = torch.repeat_interleave(torch.arange(n, device=w.device), counts)
    value = w.esc_val.view(torch.bfloat16).to(torch.float64)
    delta = (value - RECORD0_VIEW * torch.exp2(e0 - 127.0)[rows]).to(torch.float32)
    return PackedView8(
        n=n, k=k, hi=hi,
        scale=torch.exp2(e0 - DECODE_BIAS).to(torch.float32),
        e0=w.e0.clone(),
        esc_rowptr=w.esc_rowptr.to(torch.int32),
        esc_col=w.esc_col.to(torch.int32),
        esc_val=w.esc_val.clone(),
        esc_delta=delta,
    )


__all__ = ["COL_ALIGN", "DECODE_BIAS", "MIDPOINT_NIBBLE", "PackedView8", "prepare_view",
           "view_bits_of"]
