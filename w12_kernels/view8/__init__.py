"""The 8-bit view of a W12 weight: the hi plane read alone.

A W12 record's high byte holds the sign, the 4-bit exponent offset and the top three mantissa
bits, so with the row's base exponent it is an FP8-like number of every in-window weight. The
view fills the four mantissa bits the lo plane would give with their midpoint (``1000``), which
halves the worst error of truncation and leaves no bias; escapes (zeros, subnormals, specials,
out-of-window values) keep their exact value, so the view is defined for every weight. Every
view value is a BF16 number, so a BF16 GEMM over the view weights computes the view's product.

``view_bf16`` builds the view as a BF16 tensor (the readable path and what the CPU runs);
``row_error_norms`` gives each output channel's ``||W_n - V_n||_2``, which bounds how far the
view's dot product can be from the exact one (Cauchy-Schwarz: ``|h.W_n - h.V_n| <= ||h|| *
||W_n - V_n||``). ``reference.py`` holds the float64 statement of both.
"""

from __future__ import annotations

import torch

from w12.tensor import W12Tensor

MIDPOINT_NIBBLE = 8  # the low mantissa nibble the view assumes for every in-window weight


def view_bits(w: W12Tensor) -> torch.Tensor:
    """The view's BF16 bit patterns [N, K] as int16, on ``w``'s device."""
    h = w.hi.to(torch.int32)
    sign, offset, top = h >> 7, (h >> 3) & 15, h & 7
    exponent = w.e0.to(torch.int32)[:, None] + offset
    bits = sign << 15 | exponent << 7 | top << 4 | MIDPOINT_NIBBLE
    n = w.shape[0]
    if w.num_escapes:
        rows = torch.repeat_interleave(torch.arange(n, device=w.device),
                                       w.esc_rowptr[1:] - w.esc_rowptr[:-1])
        bits[rows, w.esc_col.long()] = w.esc_val.to(torch.int32) & 0xFFFF
    return (bits - ((bits >> 15) << 16)).to(torch.int16)


def view_bf16(w: W12Tensor) -> torch.Tensor:
    """The view as a BF16 tensor [N, K]."""
    return view_bits(w).view(torch.bfloat16)


def row_error_norms(w: W12Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
    """``||W_n - V_n||_2`` per output channel [N] (float32, rounded up), from the exact BF16
    weights ``exact`` (decoded from ``w`` when not given)."""
    exact = w.decode() if exact is None else exact
    view = view_bits(w)
    same = exact.view(torch.int16) == view  # escapes, infinities included: no error
    diff = torch.where(same, 0.0, exact.double() - view.view(torch.bfloat16).double())
    norms = diff.pow(2).sum(-1).sqrt()
    return torch.nextafter(norms.float(), torch.tensor(float("inf"), device=norms.device))


__all__ = ["MIDPOINT_NIBBLE", "row_error_norms", "view_bf16", "view_bits"]
