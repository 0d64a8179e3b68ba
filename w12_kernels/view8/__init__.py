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

``prepare_view`` packs the view for its GEMM (``packed.py``: the high plane as the format stores
it, one byte per weight) and ``view8_linear`` multiplies by it: Triton kernels on a GPU
(``kernels.py``, ``launcher.py``), the BF16 view and ``torch.nn.functional.linear`` on the CPU.
"""

from __future__ import annotations

import torch

from w12.tensor import W12Tensor
from w12_kernels.view8.op import view8_linear
from w12_kernels.view8.packed import (
    MIDPOINT_NIBBLE,
    PackedView8,
    prepare_view,
    view_bits_of,
)


def view_bits(w: W12Tensor) -> torch.Tensor:
    """The view's BF16 bit patterns [N, K] as int16, on ``w``'s device."""
    return view_bits_of(w.hi, w.e0, w.esc_rowptr, w.esc_col, w.esc_val)


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


__all__ = ["MIDPOINT_NIBBLE", "PackedView8", "prepare_view", "row_error_norms", "view8_linear",
           "view_bf16", "view_bits"]
