"""Row norms whose bits do not depend on how many rows share the call.

``rms_norm(x, weight, eps)`` and ``add_rms_norm(x, y, weight, eps)`` (the residual sum and its
norm) follow the Hugging Face numerics: the statistic in float32 over each row, the normalised
row rounded to the activation dtype, then scaled by the weight. On a CUDA device a Triton kernel
runs one program per row with a block fixed by the row length, so a row's reduction order is
the same whether it is computed alone (a decode step) or among the nodes of a draft tree; torch's
own reduction kernels choose their thread layout from the number of rows too. Elsewhere the
torch expression runs (its CPU reductions keep one order per row). ``reference.py`` holds the
float64 reference.
"""

from __future__ import annotations

import torch


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _use_kernel(x: torch.Tensor) -> bool:
    if not x.is_cuda:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` [..., D] with ``weight`` [D]."""
    if _use_kernel(x):
        from w12_kernels.norm.kernel import rms_norm_rows

        return rms_norm_rows(x, None, weight, eps)[1]
    return _torch_rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum ``x + y`` (in the activation dtype) and its RMSNorm."""
    if _use_kernel(x):
        from w12_kernels.norm.kernel import rms_norm_rows

        return rms_norm_rows(x, y, weight, eps)
    s = x + y
    return s, _torch_rms_norm(s, weight, eps)


__all__ = ["add_rms_norm", "rms_norm"]
