"""Launch of the INT8 head's approximate logits (``kernel.py``)."""

from __future__ import annotations

import os

import torch

from w12.errors import W12Error

BV, BK = 64, 64


def approx_logits(h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
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
    out = torch.empty((r, v), dtype=torch.float32, device=h.device)
    br = 16 if r <= 16 else 32 if r <= 32 else 64
    grid = (triton_cdiv(v, BV), triton_cdiv(r, br))
    int8_head_kernel[grid](h, q, scale, out, r, v, k, h.stride(0), q.stride(0), out.stride(0),
                           BR=br, BV=BV, BK=BK, ON_GPU=h.is_cuda)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
