"""``view8_linear`` and its ``torch.library`` op ``w12::view8_linear``.

On a CUDA device the op runs the view GEMM (``launcher.py``: one byte read per weight); on the
CPU it builds the view's BF16 weight and calls ``torch.nn.functional.linear``. As with
``w12_linear``, the registered op is used only where something traces the call.
"""

from __future__ import annotations

import torch

from w12.errors import W12Error
from w12_kernels import cpu_linear
from w12_kernels.view8.packed import PackedView8


def _impl(x: torch.Tensor, hi: torch.Tensor, scale: torch.Tensor, e0: torch.Tensor,
          esc_rowptr: torch.Tensor, esc_col: torch.Tensor, esc_val: torch.Tensor,
          esc_delta: torch.Tensor, bias: torch.Tensor | None, n: int, k: int) -> torch.Tensor:
    w = PackedView8(n, k, hi, scale, e0, esc_rowptr, esc_col, esc_val, esc_delta)
    if x.device.type == "cuda":
        from w12_kernels.view8.launcher import gemm

        return gemm(x, w, bias)
    return cpu_linear.linear(x, w.bits().view(torch.bfloat16), bias)


_op = torch.library.custom_op("w12::view8_linear", mutates_args=())(_impl)


@_op.register_fake
def _fake(x, hi, scale, e0, esc_rowptr, esc_col, esc_val, esc_delta, bias, n, k):
    return x.new_empty((x.shape[0], n))


def view8_linear(x: torch.Tensor, w: PackedView8,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x @ V.T (+ bias)`` for BF16 ``x [..., K]`` and the view ``V [N, K]`` of a W12
    weight (``prepare_view``); BF16 ``[..., N]``. Deterministic for a given shape, not batch
    invariant (``kernels.py``)."""
    if not isinstance(w, PackedView8):
        raise W12Error(f"view8_linear expects a PackedView8 weight (see prepare_view), got "
                       f"{type(w).__name__}")
    if x.dtype != torch.bfloat16 or x.dim() < 1 or x.shape[-1] != w.k:
        raise W12Error(f"view8_linear: x must be bfloat16 [..., {w.k}], got {x.dtype} "
                       f"{tuple(x.shape)}")
    if x.device != w.device:
        raise W12Error(f"view8_linear: x is on {x.device} but the weight is on {w.device}")
    if bias is not None and (bias.shape != (w.n,) or bias.dtype != torch.bfloat16):
        raise W12Error(f"view8_linear: bias must be bfloat16 of shape ({w.n},), got "
                       f"{bias.dtype} {tuple(bias.shape)}")
    rows = x.reshape(-1, w.k)
    if not rows.is_contiguous():
        rows = rows.contiguous()
    op = _op if torch.compiler.is_compiling() or type(rows) is not torch.Tensor else _impl
    y = op(rows, w.hi, w.scale, w.e0, w.esc_rowptr, w.esc_col, w.esc_val, w.esc_delta, bias,
           w.n, w.k)
    return y.reshape(*x.shape[:-1], w.n)
