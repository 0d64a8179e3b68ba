"""Launches of the INT8 head's kernel (``kernel.py``): the approximate logits, or the greedy
certification's candidates from the same product with the bounds in its epilogue."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from w12.errors import W12Error
from w12_kernels.device import launches_on_its_tensors


@dataclass(frozen=True)
class Int8HeadConfig:
    """The kernel's tile: ``bv`` vocabulary rows and ``bk`` columns a step (powers of two >=
    16), its warps and pipeline stages. The rows block follows M (16, 32 or 64). No choice
    changes a bound's validity (float32 sums in any order are inside it)."""

    bv: int = 64
    bk: int = 64
    num_warps: int = 4
    num_stages: int = 2


DEFAULT = Int8HeadConfig()  # the first tile tried; ``config_for`` is what runs
FEW_ROWS = Int8HeadConfig(bv=64, bk=256, num_warps=4, num_stages=3)
MANY_ROWS = Int8HeadConfig(bv=128, bk=128, num_warps=4, num_stages=3)


def config_for(rows: int) -> Int8HeadConfig:
    """The tile for ``rows`` hidden states, chosen by ``lab/int8_head_sweep.py`` on an H100
    (Qwen3's 151936-row heads, K 4096 and 5120): long K steps over narrow vocabulary blocks
    while the rows block is 16 (a decode step, small trees), wider vocabulary blocks above."""
    return FEW_ROWS if rows <= 16 else MANY_ROWS


@launches_on_its_tensors
def approx_logits(h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                  config: Int8HeadConfig | None = None) -> torch.Tensor:
    """``scale[v] * (h . q[v])`` [R, V] float32 for BF16 ``h`` [R, K] and INT8 ``q`` [V, K]:
    float32 sums of exact products, so within ``logit_bounds``'s allowance for a kernel. The
    Triton kernel on a GPU (or under ``TRITON_INTERPRET=1``), a float32 matmul on the CPU."""
    if h.dtype != torch.bfloat16 or q.dtype != torch.int8 or scale.dtype != torch.float32:
        raise W12Error(f"INT8 head: h {h.dtype}, q {q.dtype}, scale {scale.dtype}; needs "
                       "bfloat16, int8, float32")
    r, k = h.shape
    v = q.shape[0]
    if q.shape[1] != k or scale.shape != (v,):
        raise W12Error(f"INT8 head: h {tuple(h.shape)}, q {tuple(q.shape)}, scale "
                       f"{tuple(scale.shape)} do not match")
    if not h.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        # every product of a BF16 and an INT8 value is exact in float32
        return (h.float() @ q.float().T) * scale[None, :]
    from w12_kernels.int8_head.kernel import int8_head_kernel

    h, q = h.contiguous(), q.contiguous()
    config = config or config_for(r)
    out = torch.empty((r, v), dtype=torch.float32, device=h.device)
    br = _rows_block(r)
    grid = (triton_cdiv(v, config.bv), triton_cdiv(r, br))
    int8_head_kernel[grid](h, q, scale, out, r, v, k, h.stride(0), q.stride(0), out.stride(0),
                           scale, scale, scale, out, 0, 0.0, 0.0, 0.0, 0.0,
                           BR=br, BV=config.bv, BK=config.bk, ON_GPU=h.is_cuda, CERTIFY=False,
                           num_warps=config.num_warps, num_stages=config.num_stages)
    return out


@launches_on_its_tensors
def greedy_candidates(h: torch.Tensor, head, config: Int8HeadConfig | None = None
                      ) -> torch.Tensor:
    """[R, V] bool: the entries whose upper bound reaches the row's best lower bound (the
    greedy certification of ``reference.candidates`` on ``certify.bounds32``'s bounds), with
    the bounds computed in the product's epilogue: one kernel, then a [R, blocks] maximum and
    one comparison. ``head``: a ``certify.DeviceHead``."""
    from w12_kernels.int8_head.certify import Widening, bounds32, hidden_norms
    from w12_kernels.int8_head.reference import candidates

    if not h.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        lo, hi = bounds32(head, h, approx_logits(h, head.q, head.scale))
        return candidates(lo, hi)
    from w12_kernels.int8_head.kernel import int8_head_kernel

    r, k = h.shape
    v = head.q.shape[0]
    if h.dtype != torch.bfloat16 or head.q.shape[1] != k:
        raise W12Error(f"INT8 head: hidden states {h.dtype} {tuple(h.shape)} for a head of "
                       f"{tuple(head.q.shape)}")
    w = Widening.of(k)
    config = config or config_for(r)
    h = h.contiguous()
    hn = hidden_norms(h, w).contiguous()
    hi = torch.empty((r, v), dtype=torch.float32, device=h.device)
    blocks = triton_cdiv(v, config.bv)
    best = torch.empty((r, blocks), dtype=torch.float32, device=h.device)
    br = _rows_block(r)
    int8_head_kernel[(blocks, triton_cdiv(r, br))](
        h, head.q, head.scale, hi, r, v, k, h.stride(0), head.q.stride(0), hi.stride(0),
        head.err, head.wsum, hn, best, best.stride(0), w.gamma, w.u_sum, w.radius, w.widen,
        BR=br, BV=config.bv, BK=config.bk, ON_GPU=h.is_cuda, CERTIFY=True,
        num_warps=config.num_warps, num_stages=config.num_stages)
    return hi >= best.amax(dim=1, keepdim=True)


def _rows_block(r: int) -> int:
    return 16 if r <= 16 else 32 if r <= 32 else 64


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
