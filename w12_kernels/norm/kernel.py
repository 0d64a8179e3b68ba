"""The Triton row-norm kernel: one program per row, the whole row in one block."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from w12_kernels.device import launches_on_its_tensors


@triton.jit
def _rms_norm_kernel(x_ptr, y_ptr, w_ptr, sum_ptr, out_ptr, D, eps,
                     HAS_Y: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=live, other=0.0)
    if HAS_Y:
        y = tl.load(y_ptr + row * D + cols, mask=live, other=0.0)
        x = (x.to(tl.float32) + y.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * D + cols, x, mask=live)
    xf = x.to(tl.float32)
    mean = tl.sum(xf * xf, axis=0) / D
    normed = (xf * (1.0 / tl.sqrt(mean + eps))).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=live, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * D + cols, out, mask=live)


@launches_on_its_tensors
def rms_norm_rows(x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float,
                  *, kernel=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + y or x, its RMSNorm times ``weight``) over the last dim; rows of any count.

    ``kernel`` is the jitted kernel to launch (tests pass an interpreted copy)."""
    d = x.shape[-1]
    if weight.shape != (d,):
        raise ValueError(f"rms_norm: weight of shape {tuple(weight.shape)} for rows of {d}")
    x = x.contiguous()
    rows = x.numel() // d
    out = torch.empty(x.shape, dtype=torch.result_type(weight, x), device=x.device)
    total = torch.empty_like(x) if y is not None else x
    if rows:
        block = triton.next_power_of_2(d)
        (kernel or _rms_norm_kernel)[(rows,)](
            x, y.contiguous() if y is not None else x, weight, total, out, d, eps,
            HAS_Y=y is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)))
    return total, out
