"""``w12_linear`` and its ``torch.library`` op ``w12::linear``.

The op takes the packed weight's tensors as arguments so that ``torch.compile`` and CUDA-graph
capture see every buffer the kernels touch; its fake implementation only allocates the output.
On a CUDA device the op runs the GPU kernels (``dispatch``: CUDA C through CuPy, or Triton);
on the CPU it decodes the weight (numba) and calls ``torch.nn.functional.linear`` (through
``cpu_linear``, so that one row gets the bits it gets among several), which gives exactly what
BF16 torch gives on the decoded weight. ``w12_linear`` goes through the op only
where something traces it (``torch.compile``, fake tensors) and calls its body directly
otherwise, for the dispatcher's host time (docs/notebook/engine.md, prefill).
"""

from __future__ import annotations

import torch

from w12.errors import W12Error
from w12_kernels import cpu_linear
from w12_kernels.gemm.layout import PackedW12, decode_packed


def _linear_impl(
    x: torch.Tensor,
    chunks: torch.Tensor,
    scale: torch.Tensor,
    e0: torch.Tensor,
    esc_rowptr: torch.Tensor,
    esc_row: torch.Tensor,
    esc_col: torch.Tensor,
    esc_val: torch.Tensor,
    esc_delta: torch.Tensor,
    esc_order: torch.Tensor,
    esc_entry: torch.Tensor,
    esc_fix: torch.Tensor,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    rows_kept: int = 0,
) -> torch.Tensor:
    if x.device.type == "cuda":
        from w12_kernels.gemm import dispatch

        return dispatch.linear(x, chunks, scale, e0, esc_rowptr, esc_row, esc_col, esc_val,
                               esc_delta, esc_order, esc_entry, esc_fix, bias, n, k,
                               rows_kept)
    if chunks.device.type == "cpu":
        from w12_kernels.gemm.decode.cpu import decode_packed_cpu

        weight = decode_packed_cpu(chunks, e0, esc_rowptr, esc_col, esc_val, n, k)
    else:
        weight = decode_packed(chunks, e0, esc_rowptr, esc_col, esc_val, n, k)
    return cpu_linear.linear(x, weight, bias)


_linear_op = torch.library.custom_op("w12::linear", mutates_args=())(_linear_impl)


@_linear_op.register_fake
def _linear_fake(x, chunks, scale, e0, esc_rowptr, esc_row, esc_col, esc_val, esc_delta,
                 esc_order, esc_entry, esc_fix, bias, n, k, rows_kept=0):
    return x.new_empty((x.shape[0], n))


def _check(x: torch.Tensor, w: PackedW12, bias: torch.Tensor | None) -> None:
    if not isinstance(w, PackedW12):
        raise W12Error(
            f"w12_linear expects a PackedW12 weight (see prepare_weight), got {type(w).__name__}"
        )
    if x.dtype != torch.bfloat16:
        raise W12Error(f"w12_linear: x must be bfloat16, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != w.k:
        raise W12Error(f"w12_linear: x has shape {tuple(x.shape)}, expected [..., {w.k}]")
    if x.device != w.device:
        raise W12Error(f"w12_linear: x is on {x.device} but the weight is on {w.device}")
    if bias is not None and (bias.shape != (w.n,) or bias.dtype != torch.bfloat16):
        raise W12Error(
            f"w12_linear: bias must be bfloat16 of shape ({w.n},), "
            f"got {bias.dtype} {tuple(bias.shape)}"
        )


def w12_linear(
    x: torch.Tensor, w: PackedW12, bias: torch.Tensor | None = None, *,
    invariant_rows: int | None = None,
) -> torch.Tensor:
    """``y = x @ W.T (+ bias)`` for BF16 ``x [..., K]`` and a packed W12 weight ``W [N, K]``.

    Returns BF16 ``[..., N]``. Deterministic; for up to 64 rows of ``x`` (128 with the CUDA
    kernels) the bits of each output row do not depend on the other rows. ``invariant_rows``
    64 keeps that only up to 64 rows for this call, so that 65..128 rows take the faster
    large-M path (as ``dispatch.invariant_rows(64)`` does for a scope; a plain argument also
    passes through ``torch.compile``); ``None``: the scope's setting.
    """
    _check(x, w, bias)
    if invariant_rows is not None:
        from w12_kernels.gemm.dispatch import check_invariant_rows

        try:
            check_invariant_rows(invariant_rows, "w12_linear")
        except ValueError as exc:
            raise W12Error(str(exc)) from None
    rows = x.reshape(-1, w.k)
    if not rows.is_contiguous():
        rows = rows.contiguous()
    # the registered op where a tracer needs it (torch.compile, fake tensors); otherwise its
    # body straight away: the dispatcher costs ~30 us of host time per call, which eager
    # prefill pays on every layer (CUDA-graph replays pay nothing either way)
    op = _linear_op if torch.compiler.is_compiling() or type(rows) is not torch.Tensor \
        else _linear_impl
    y = op(rows, w.chunks, w.scale, w.e0, w.esc_rowptr, w.esc_row, w.esc_col, w.esc_val,
           w.esc_delta, w.esc_order, w.esc_entry, w.esc_fix, bias, w.n, w.k, invariant_rows or 0)
    return y.reshape(*x.shape[:-1], w.n)
