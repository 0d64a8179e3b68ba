"""Launchers of the Triton kernels in ``kernels.py``: check, allocate, size the grid, launch.

This is the portable path of the W12 GEMM: GPUs where the CUDA C kernels cannot run (no CuPy),
and the CPU under ``TRITON_INTERPRET=1`` (``on_gpu=False``), where loop trip counts go in as
constants (see ``kernels.py``). ``gemm`` takes up to 64 rows with the batch-invariant K split
of the CUDA small-M kernel; above that the dispatch decodes the weight (``decode``) and calls
cuBLAS. ``kernels`` is the module holding the jitted kernels (tests pass an interpreted copy);
by default ``kernels.py``, imported on first use so that Triton stays an optional dependency.
"""

from __future__ import annotations

import torch

from w12.errors import W12Error
from w12_kernels.device import launches_on_its_tensors

SMALL_BLOCK_M = 16  # activation rows per program up to SMALL_M_MAX rows (tl.dot's minimum)
LARGE_BLOCK_M = 64
SMALL_M_MAX = 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _kernels(kernels):
    if kernels is not None:
        return kernels
    from w12_kernels.gemm.triton import kernels as jitted

    return jitted


def _max_row_escapes(esc_rowptr: torch.Tensor) -> int:
    """The longest escape list of any row (the interpreter's trip count of the escape loop)."""
    if esc_rowptr.numel() < 2:
        return 0
    return int((esc_rowptr[1:] - esc_rowptr[:-1]).max())


def _check_chunks(chunks: torch.Tensor, n: int, k: int) -> tuple[int, int]:
    if chunks.dim() != 3 or chunks.shape[2] != 384 or chunks.dtype != torch.int32:
        raise W12Error(f"chunks must be int32 [Np/16, Kp/64, 384], got {chunks.dtype} "
                       f"{tuple(chunks.shape)}")
    tiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    if tiles * 16 < n or nchunks * 64 < k:
        raise W12Error(f"chunks {tuple(chunks.shape)} cover {tiles * 16} x {nchunks * 64} "
                       f"weights, fewer than the {n} x {k} asked for")
    return tiles, nchunks


def _rows_and_output(x: torch.Tensor, out: torch.Tensor | None, n: int, k: int,
                     name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` checked (BF16 [M, K]) with unit column stride, and the BF16 [M, N] output."""
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.bfloat16:
        raise W12Error(f"{name}: x must be bfloat16 [M, {k}], got {x.dtype} {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty((x.shape[0], n), dtype=torch.bfloat16, device=x.device)
    return x, out


@launches_on_its_tensors
def gemm(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor, esc_rowptr: torch.Tensor,
         esc_row: torch.Tensor, esc_col: torch.Tensor, esc_delta: torch.Tensor,
         bias: torch.Tensor | None, n: int, k: int, *, kw: int, on_gpu: bool = True,
         kernels=None, out: torch.Tensor | None = None,
         tiles_per_program: int = 1) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for BF16 ``x [M, K]``, as BF16 ``[M, N]`` (written into ``out``
    when given).

    ``kw`` partial sums per row tile (sum ``w`` over chunks ``w, w + kw, ...``, like the CUDA
    kernel's warps) are added in fixed order; ``kw`` should depend on the weight shape only.
    ``tiles_per_program`` 16-row tiles share one program. The kernel finds a row's escapes
    through ``esc_rowptr``; ``esc_row`` is taken for the op's uniform argument list and not
    read. Up to 64 rows of ``x`` the bits of an output row do not depend on the other rows.
    """
    del esc_row  # the row of every escape is implied by esc_rowptr
    tiles, nchunks = _check_chunks(chunks, n, k)
    if kw < 1 or tiles_per_program not in (1, 2, 4, 8):
        raise W12Error(f"gemm: kw must be >= 1 and tiles_per_program 1, 2, 4 or 8, got kw={kw}, "
                       f"tiles_per_program={tiles_per_program}")
    x, out = _rows_and_output(x, out, n, k, "gemm")
    m = x.shape[0]
    if m == 0 or n == 0:
        return out
    block_m = SMALL_BLOCK_M if m <= SMALL_M_MAX else LARGE_BLOCK_M
    rows = 16 * tiles_per_program
    grid = (_cdiv(tiles, tiles_per_program), _cdiv(m, block_m))
    _kernels(kernels).w12_gemm_kernel[grid](
        x, chunks, scale, esc_rowptr, esc_col, esc_delta,
        bias if bias is not None else scale, out,
        m, n, k, tiles, nchunks, x.stride(0), out.stride(0),
        KW=kw, ROWS=rows, BLOCK_M=block_m, HAS_BIAS=bias is not None, ON_GPU=on_gpu,
        CHUNK_ITERS=0 if on_gpu else _cdiv(nchunks, kw),
        ESC_ITERS=0 if on_gpu else _max_row_escapes(esc_rowptr),
    )
    return out


@launches_on_its_tensors
def decode(chunks: torch.Tensor, scale: torch.Tensor, esc_row: torch.Tensor,
           esc_col: torch.Tensor, esc_val: torch.Tensor, n: int, k: int, *,
           on_gpu: bool = True, kernels=None, tiles_per_program: int = 1) -> torch.Tensor:
    """The exact BF16 weight [N, K]: ``w12_decode_kernel``, then the escapes (int16 BF16 bits)
    written in."""
    tiles, nchunks = _check_chunks(chunks, n, k)
    out = torch.empty((n, k), dtype=torch.bfloat16, device=chunks.device)
    if n and k:
        grid = (_cdiv(tiles, tiles_per_program), nchunks)
        _kernels(kernels).w12_decode_kernel[grid](
            chunks, scale, out, n, k, tiles, nchunks, ROWS=16 * tiles_per_program,
            ON_GPU=on_gpu)
    if esc_col.numel():
        # positions are unique, so the scatter is deterministic
        out.view(torch.int16)[esc_row.long(), esc_col.long()] = esc_val
    return out
