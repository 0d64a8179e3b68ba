"""Launch of the view GEMM's Triton kernels (``kernels.py``): check, size the grid, launch.

``config_for(m, n, k, sms)`` picks the blocks and the K split from the shape: ``BLOCK_M`` the
rows rounded up to a power of two (16 to 128, so that up to 128 rows read the weights once),
``BLOCK_N`` wider as M grows (each program reads the activations of its split once per
``BLOCK_N`` rows, so a narrow block at many rows turns the GEMM into an activation stream from
L2), and the fewest splits (a power of two, at most ``MAX_SPLIT``, each at least ``MIN_SPLIT_K``
columns) that give every multiprocessor ``PROGRAMS_PER_SM`` programs. A split costs a float32
partial product of M x N written and read back, 8 M / K of the weight's bytes (1/16 at 32 rows
and K = 4096), so splitting stops as soon as the machine is full. ``benchmarks/view8.py
--sweep`` times the alternatives, the CUDA-core kernel (``gemv``) among them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from w12.errors import W12Error
from w12_kernels.device import launches_on_its_tensors
from w12_kernels.view8.packed import PackedView8

MAX_SPLIT = 8
MIN_SPLIT_K = 512
PROGRAMS_PER_SM = 2


@dataclass(frozen=True)
class View8Config:
    """Blocks, K split and launch of one call. ``gemv``: the CUDA-core path, whose ``block_m``
    (1, 2 or 4) is the rows a program takes."""

    block_n: int
    block_m: int
    block_k: int
    split: int
    warps: int = 4
    stages: int = 3
    gemv: bool = False


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(v: int) -> int:
    return 1 << max(v - 1, 0).bit_length()


def config_for(m: int, n: int, k: int, sms: int) -> View8Config:
    block_m = min(128, max(16, _pow2_at_least(m)))
    block_n = 32 if block_m <= 16 else 64 if block_m <= 32 else 128
    block_k = 256 if block_m <= 32 else 128
    programs = _cdiv(n, block_n) * _cdiv(m, block_m)
    split = 1
    while (split < MAX_SPLIT and programs * split < PROGRAMS_PER_SM * sms
           and k // (2 * split) >= MIN_SPLIT_K):
        split *= 2
    return View8Config(block_n, block_m, block_k, split, warps=4 if block_m <= 32 else 8)


def _kernels(kernels):
    if kernels is not None:
        return kernels
    from w12_kernels.view8 import kernels as jitted

    return jitted


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


@launches_on_its_tensors
def gemm(x: torch.Tensor, w: PackedView8, bias: torch.Tensor | None = None, *,
         config: View8Config | None = None, on_gpu: bool = True, kernels=None) -> torch.Tensor:
    """``x @ V^T (+ bias)`` for BF16 ``x [M, K]`` (unit column stride), as BF16 ``[M, N]``."""
    m, n, k = x.shape[0], w.n, w.k
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return out
    c = config or config_for(m, n, k, _sms(x.device))
    if c.block_k < 16 or c.split < 1 or c.block_n < 16 or (
            c.block_m not in (1, 2, 4) if c.gemv else c.block_m < 16):
        raise W12Error(f"view8 gemm: blocks must be at least 16 (block_m 1, 2 or 4 rows with "
                       f"gemv) and split at least 1, got {c}")
    k_split = _cdiv(_cdiv(k, c.split), c.block_k) * c.block_k
    split = _cdiv(k, k_split) if k else 1  # no empty split
    part = (torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1
            else w.scale)
    esc_iters = 0
    if not on_gpu and w.num_escapes:
        esc_iters = int((w.esc_rowptr[1:] - w.esc_rowptr[:-1]).max())
    jit = _kernels(kernels)
    bias_arg = bias if bias is not None else w.scale
    launch = {"num_warps": c.warps, "num_stages": c.stages} if on_gpu else {}
    jit.view8_gemm_kernel[(_cdiv(n, c.block_n), split, _cdiv(m, c.block_m))](
        x, w.hi, part, w.scale, w.esc_rowptr, w.esc_col, w.esc_delta, bias_arg, out,
        m, n, k, k_split, x.stride(0), w.hi.stride(0), out.stride(0),
        BLOCK_N=c.block_n, BLOCK_M=c.block_m, BLOCK_K=c.block_k, SPLIT=split, GEMV=c.gemv,
        HAS_BIAS=bias is not None, ON_GPU=on_gpu, K_ITERS=0 if on_gpu else k_split // c.block_k,
        ESC_ITERS=esc_iters, **launch)
    if split > 1:
        block_m = max(16, c.block_m)
        jit.view8_reduce_kernel[(_cdiv(n, c.block_n), _cdiv(m, block_m))](
            part, x, w.scale, w.esc_rowptr, w.esc_col, w.esc_delta, bias_arg, out,
            m, n, x.stride(0), out.stride(0),
            BLOCK_N=c.block_n, BLOCK_M=block_m, SPLIT=split, HAS_BIAS=bias is not None,
            ON_GPU=on_gpu, ESC_ITERS=esc_iters, **launch)
    return out
