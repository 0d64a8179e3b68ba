"""Triton kernels of the 8-bit view GEMM: ``y = x @ V^T`` reading one byte per weight.

``view8_gemm_kernel``: one program per (``BLOCK_N`` weight rows, K split ``s``, ``BLOCK_M``
activation rows). It walks its split's columns ``BLOCK_K`` at a time: a [BLOCK_N, BLOCK_K] block
of the high plane (``packed.py``), decoded to BF16 with three integer operations per byte, times
the activations' [BLOCK_K, BLOCK_M] block, summed in float32. With one split the program runs
the epilogue itself; with several it stores its float32 partial product and
``view8_reduce_kernel`` adds the splits in order 0..SPLIT-1 and runs the epilogue.
With ``GEMV`` the same kernel takes 1, 2 or 4 rows a program on the CUDA cores (float32
products summed along K), which may suit a decode step better; the launcher's configuration
picks it. The epilogue is the exact GEMM's (``w12_kernels.gemm.triton.kernels.store_output``):
row scales, escape corrections in list order, bias, BF16 rounding.

The sums are deterministic (no atomics; fixed split order) but their order depends on the
launch configuration, which the launcher picks from M: a row's bits may change with the number
of rows. The view only steers two-level verification, so nothing needs batch invariance here.

As in the exact GEMM's Triton kernels, ``ON_GPU = False`` (``TRITON_INTERPRET=1``) passes loop
trip counts as constants (``K_ITERS``, ``ESC_ITERS``) and multiplies in float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from w12_kernels.gemm.triton.kernels import _mma, store_output


@triton.jit
def _view_block(hi_ptr, rows, cols, stride_h, N, kend):
    """The decoded [BLOCK_N, BLOCK_K] block: BF16 bits of ``view x 2^(DECODE_BIAS - e0)``
    (rows past N and columns past the split read record 0 and meet zeroed activations)."""
    h = tl.load(hi_ptr + rows[:, None].to(tl.int64) * stride_h + cols[None, :],
                mask=(rows[:, None] < N) & (cols[None, :] < kend), other=0).to(tl.int32)
    bits = ((h & 0x80) << 8) | ((h & 0x7F) << 4) | 0x3808
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _k_step(acc, kk, kend, hi_ptr, rows, stride_h, N, x_ptr, ms, stride_xm, M,
            BLOCK_K: tl.constexpr, GEMV: tl.constexpr, ON_GPU: tl.constexpr):
    """acc[BLOCK_N, BLOCK_M] += the decoded block times the activations' block: on tensor
    cores, or (``GEMV``) as float32 products summed along K on the CUDA cores."""
    cols = kk + tl.arange(0, BLOCK_K)
    w = _view_block(hi_ptr, rows, cols, stride_h, N, kend)
    if GEMV:
        x = tl.load(x_ptr + ms[:, None].to(tl.int64) * stride_xm + cols[None, :],
                    mask=(ms[:, None] < M) & (cols[None, :] < kend), other=0.0).to(tl.float32)
        acc = acc + tl.sum(w.to(tl.float32)[:, None, :] * x[None, :, :], axis=2)
    else:
        xt = tl.load(x_ptr + ms[None, :].to(tl.int64) * stride_xm + cols[:, None],
                     mask=(ms[None, :] < M) & (cols[:, None] < kend), other=0.0)
        acc = _mma(w, xt, acc, ON_GPU)
    return acc


@triton.jit(do_not_specialize=["M"])
def view8_gemm_kernel(
    x_ptr, hi_ptr, part_ptr, scale_ptr, rowptr_ptr, esc_col_ptr, esc_delta_ptr, bias_ptr, out_ptr,
    M, N, K, k_split, stride_xm, stride_h, stride_om,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
    GEMV: tl.constexpr, HAS_BIAS: tl.constexpr, ON_GPU: tl.constexpr, K_ITERS: tl.constexpr,
    ESC_ITERS: tl.constexpr,
):
    """out[M, N] = x[M, K] @ V^T (+ bias), or with SPLIT > 1 the float32 partial products
    part[SPLIT, M, N] of the splits (module docstring). ``k_split``: columns of a split, a
    multiple of BLOCK_K. ``GEMV``: CUDA cores, ``BLOCK_M`` 1, 2 or 4."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    ms = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    k0 = split * k_split
    kend = tl.minimum(k0 + k_split, K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if ON_GPU:
        for kk in range(k0, kend, BLOCK_K):
            acc = _k_step(acc, kk, kend, hi_ptr, rows, stride_h, N, x_ptr, ms, stride_xm, M,
                          BLOCK_K, GEMV, ON_GPU)
    else:
        for i in range(0, K_ITERS):  # surplus steps read nothing: every column is masked
            acc = _k_step(acc, k0 + i * BLOCK_K, kend, hi_ptr, rows, stride_h, N, x_ptr, ms,
                          stride_xm, M, BLOCK_K, GEMV, ON_GPU)
    if SPLIT == 1:
        store_output(acc, rows, ms, M, N, x_ptr, stride_xm, scale_ptr, rowptr_ptr, esc_col_ptr,
                     esc_delta_ptr, bias_ptr, out_ptr, stride_om, HAS_BIAS, ESC_ITERS, ON_GPU)
    else:
        ptrs = part_ptr + (split * M + ms[None, :]).to(tl.int64) * N + rows[:, None]
        tl.store(ptrs, acc, mask=(ms[None, :] < M) & (rows[:, None] < N))


@triton.jit(do_not_specialize=["M"])
def view8_reduce_kernel(
    part_ptr, x_ptr, scale_ptr, rowptr_ptr, esc_col_ptr, esc_delta_ptr, bias_ptr, out_ptr,
    M, N, stride_xm, stride_om,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ON_GPU: tl.constexpr, ESC_ITERS: tl.constexpr,
):
    """The splits' partial products added in order 0..SPLIT-1, then the epilogue."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = (ms[None, :] < M) & (rows[:, None] < N)
    ptrs = part_ptr + ms[None, :].to(tl.int64) * N + rows[:, None]
    acc = tl.load(ptrs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(ptrs + s * M * N, mask=ok, other=0.0)
    store_output(acc, rows, ms, M, N, x_ptr, stride_xm, scale_ptr, rowptr_ptr, esc_col_ptr,
                 esc_delta_ptr, bias_ptr, out_ptr, stride_om, HAS_BIAS, ESC_ITERS, ON_GPU)
