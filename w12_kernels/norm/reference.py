"""Readable float64 references of the row norms (the error budget of the kernels' tests)."""

from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dim, in float64."""
    xd = x.double()
    return weight.double() * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
