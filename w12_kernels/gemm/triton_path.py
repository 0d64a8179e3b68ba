"""Launchers of the Triton kernels in ``kernel.py``: check, allocate, size the grid, launch.

This is the portable path of the W12 GEMM: GPUs where the CUDA C kernels (``cuda.py``) cannot
run, and the CPU under ``TRITON_INTERPRET=1`` (``on_gpu=False``), where loop trip counts go in
as constants (see ``kernel.py``). ``kernels`` is the module holding the jitted kernels (tests
pass an interpreted copy); by default ``kernel.py``, imported on first use so that Triton stays
an optional dependency.
"""

from __future__ import annotations

import torch

from w12.errors import W12Error

SMALL_BLOCK_M = 16  # activation rows per program up to SMALL_M_MAX rows (tl.dot's minimum)
LARGE_BLOCK_M = 64
SMALL_M_MAX = 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _kernels(kernels):
    if kernels is not None:
        return kernels
    from w12_kernels.gemm import kernel

    return kernel


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


# The largest accumulator (16 x tiles x block_m float32) a program may hold: Triton 3.6 compiled
# the 32768-element block of 8 tiles x 256 rows x 8 warps into a kernel that gave NaN for 15%
# of the outputs of a 4096x4096 weight on the H200 (docs/PERF_GEMM.md); every block the sweep
# tries is within this.
LARGE_ACC_MAX = 16384
SPLIT_FINISH_BLOCK = 64  # rows and activation rows per program of the split-K epilogue


def gemm_large(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor,
               esc_rowptr: torch.Tensor, esc_col: torch.Tensor, esc_delta: torch.Tensor,
               bias: torch.Tensor | None, n: int, k: int, *, tiles: int = 8, block_m: int = 128,
               num_warps: int = 8, num_stages: int = 3, maxnreg: int = 0, splits: int = 1,
               on_gpu: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` by the tensor-core kernel of ``kernel_large.py``: ``tiles`` 16-row
    weight tiles and ``block_m`` rows of ``x`` per program; ``maxnreg`` > 0 caps the registers
    per thread (more programs per multiprocessor, the rare escape epilogue spilling instead);
    ``splits`` > 1 cuts K into that many ranges (programs) summed
    in order by a second kernel through a float32 workspace of ``splits x M x N``.
    Deterministic, but the bits of a row may depend on M and on the configuration (for the rows
    beyond the batch-invariant path)."""
    from w12_kernels.gemm import kernel_large

    ntiles, nchunks = _check_chunks(chunks, n, k)
    if (tiles not in (1, 2, 4, 8, 16) or block_m not in (16, 32, 64, 128, 256) or splits < 1
            or 16 * tiles * block_m > LARGE_ACC_MAX):
        raise W12Error(f"gemm_large: tiles must be 1, 2, 4, 8 or 16, block_m 16..256 (a power "
                       f"of two), 16 x tiles x block_m <= {LARGE_ACC_MAX} and splits >= 1, got "
                       f"tiles={tiles}, block_m={block_m}, splits={splits}")
    x, out = _rows_and_output(x, out, n, k, "gemm_large")
    m = x.shape[0]
    if m == 0 or n == 0:
        return out
    splits = max(1, min(splits, nchunks))
    per = _cdiv(nchunks, splits)
    splits = _cdiv(nchunks, per)  # no empty range
    ws = (torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1
          else scale)
    bias_arg = bias if bias is not None else scale
    grid = (_cdiv(ntiles, tiles) * splits * _cdiv(m, block_m),)
    extra = {"num_warps": num_warps, "num_stages": num_stages} if on_gpu else {}
    if on_gpu and maxnreg:
        extra["maxnreg"] = maxnreg
    esc_iters = 0 if on_gpu else _max_row_escapes(esc_rowptr)
    kernel_large.w12_gemm_large_kernel[grid](
        x, chunks, scale, esc_rowptr, esc_col, esc_delta, bias_arg, out, ws,
        m, n, k, ntiles, nchunks, splits, x.stride(0), out.stride(0),
        CN=tiles, BLOCK_M=block_m, SPLIT=splits > 1,
        HAS_BIAS=bias is not None, ON_GPU=on_gpu, CHUNK_ITERS=0 if on_gpu else per,
        ESC_ITERS=esc_iters, **extra,
    )
    if splits > 1:
        block = SPLIT_FINISH_BLOCK
        kernel_large.w12_splitk_finish_kernel[(_cdiv(n, block), _cdiv(m, block))](
            ws, x, scale, esc_rowptr, esc_col, esc_delta, bias_arg, out,
            m, n, splits, x.stride(0), out.stride(0),
            BLOCK_N=block, BLOCK_M=block, HAS_BIAS=bias is not None, ON_GPU=on_gpu,
            SPLIT_ITERS=0 if on_gpu else splits, ESC_ITERS=esc_iters,
        )
    return out


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
