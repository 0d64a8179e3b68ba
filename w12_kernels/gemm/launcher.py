"""Launchers: pick a configuration, allocate, size the grid, launch.

``linear`` is what the op calls on a GPU: M <= 64 goes to the small-M configuration (one per
weight shape); larger M to the wide-tile configuration, or, when the tuned table says so, to
``decode`` (the exact BF16 weight) + cuBLAS. ``launch`` takes an explicit configuration
(benchmarks and tests use it; under ``TRITON_INTERPRET=1`` it runs on CPU tensors).
"""

from __future__ import annotations

import functools

import torch

from w12_kernels.gemm import config as cfgs
from w12_kernels.gemm import kernel as compiled_kernels
from w12_kernels.gemm.layout import PackedW12


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_config(n: int, k: int, m: int, device: torch.device) -> cfgs.GemmConfig | None:
    """The configuration ``linear`` uses; None means decode + cuBLAS."""
    sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    if m <= cfgs.SMALL_M_MAX:
        return cfgs.small_config(n, k, sms)
    return cfgs.large_config(n, k, m, sms)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _max_escape_chunks(esc_rowptr: torch.Tensor, block_n: int, chunk: int) -> int:
    """Largest number of escape chunks in any row tile (the interpreter's fixed trip count)."""
    per_tile = esc_rowptr[block_n::block_n] - esc_rowptr[:-1:block_n]
    return int((per_tile + chunk - 1).div(chunk, rounding_mode="floor").max())


def even_split(wanted: int, k_blocks: int) -> int:
    """The largest power of two <= ``wanted`` that divides ``k_blocks``, so that every split
    gets the same number of K blocks."""
    split = 1
    while split * 2 <= wanted and k_blocks % (split * 2) == 0:
        split *= 2
    return split


def launch(x, planes, scale, esc_rowptr, esc_row, esc_col, esc_delta, counters, bias, n, k,
           cfg: cfgs.GemmConfig, *, on_gpu: bool = True, kernels=None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Run ``w12_gemm_kernel`` with ``cfg``; ``x`` is [M, K] contiguous BF16.

    ``kernels`` is the module holding the jitted kernels (tests pass an interpreted copy);
    ``out`` (BF16 [M, N], contiguous) is written in place when given.
    """
    kernels = kernels or compiled_kernels
    m = x.shape[0]
    np_ = planes.shape[1]
    groups = planes.shape[2]
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return out
    chunks = min(_cdiv(m, cfg.block_m), cfg.max_chunks)
    grid_m = _cdiv(m, cfg.block_m * chunks)
    kb_total = _cdiv(k, cfg.block_k)
    split = even_split(cfg.split_k if grid_m == 1 else 1, kb_total)
    kb_per_split = kb_total // split
    # trip counts as constants for the interpreter only (see kernel docstring)
    esc_iters = 0 if on_gpu else _max_escape_chunks(esc_rowptr, cfg.block_n, cfg.esc_chunk)
    part = torch.empty((split, m, np_) if split > 1 else (1,), dtype=torch.float32,
                       device=x.device)
    grid = (np_ // cfg.block_n, grid_m, split)
    kernels.w12_gemm_kernel[grid](
        x, planes, scale, esc_rowptr, esc_row, esc_col, esc_delta,
        bias if bias is not None else scale, out, part, counters,
        m, n, k, np_, groups, x.stride(0), out.stride(0), kb_per_split, kb_total, split,
        HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        BLOCK_M=cfg.block_m, NUM_CHUNKS=chunks, SPLIT=split > 1,
        EVEN_K=k % cfg.block_k == 0, USE_ASM=cfg.use_asm and on_gpu, ON_GPU=on_gpu,
        ESC_CHUNK=cfg.esc_chunk, KB_ITERS=0 if on_gpu else kb_per_split,
        SPLIT_ITERS=0 if on_gpu else split, ESC_ITERS=esc_iters, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out


def decode_planes(planes, scale, esc_row, esc_col, esc_val, n, k, *, block_n=32,
                  block_k=256, use_asm=True, on_gpu=True, kernels=None) -> torch.Tensor:
    """The exact BF16 weight [N, K]: ``w12_decode_kernel``, then the escapes (int16 BF16 bits)
    written in."""
    kernels = kernels or compiled_kernels
    np_, groups = planes.shape[1], planes.shape[2]
    out = torch.empty((n, k), dtype=torch.bfloat16, device=planes.device)
    grid = (np_ // block_n, groups * 8 // block_k)
    kernels.w12_decode_kernel[grid](planes, scale, out, n, k, np_, groups, BLOCK_N=block_n,
                                    BLOCK_K=block_k, USE_ASM=use_asm and on_gpu)
    if esc_col.numel():
        # positions are unique, so the scatter is deterministic
        out.view(torch.int16)[esc_row.long(), esc_col.long()] = esc_val
    return out


def decode(pw: PackedW12, **kwargs) -> torch.Tensor:
    """The exact BF16 weight of a :class:`PackedW12` (Triton decode kernel)."""
    return decode_planes(pw.planes, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, pw.n, pw.k,
                         **kwargs)


def linear(x, planes, scale, esc_rowptr, esc_row, esc_col, esc_val, esc_delta, counters, bias,
           n, k):
    """The op's GPU path (see module docstring)."""
    cfg = default_config(n, k, x.shape[0], x.device)
    if cfg is None:
        weight = decode_planes(planes, scale, esc_row, esc_col, esc_val, n, k)
        return torch.nn.functional.linear(x, weight, bias)
    return launch(x, planes, scale, esc_rowptr, esc_row, esc_col, esc_delta, counters, bias,
                  n, k, cfg)


def launch_packed(x: torch.Tensor, pw: PackedW12, bias: torch.Tensor | None,
                  cfg: cfgs.GemmConfig, *, on_gpu: bool = True, kernels=None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``launch`` with the tensors of a :class:`PackedW12`."""
    return launch(x, pw.planes, pw.scale, pw.esc_rowptr, pw.esc_row, pw.esc_col, pw.esc_delta,
                  pw.counters, bias, pw.n, pw.k, cfg, on_gpu=on_gpu, kernels=kernels, out=out)
