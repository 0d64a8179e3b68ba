"""``x @ W.T + b`` on the CPU with each row's bits independent of the other rows.

torch's CPU BF16 linear runs a one-row product with another kernel than a product of two or
more rows, and the two can round differently: on the demo model's activations, a down
projection's row differs in the last place between M = 1 and M = 2..128, while every M >= 2
gives a row the same bits (random activations rarely show it). A decode step has one row where
a verify step has several, so speculative decoding on the CPU would not reproduce plain
decoding. ``linear`` sends a single row through the several-row kernel, as two copies of
itself; the tests that compare speculative with plain decoding on real weights (the demo model)
are what would notice another split of the kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; on the CPU a single row runs as two (module docstring)."""
    if x.device.type != "cpu" or x.numel() != x.shape[-1]:
        return F.linear(x, weight, bias)
    row = x.reshape(1, -1)
    y = F.linear(torch.cat([row, row]), weight, bias)[:1]
    return y.reshape(*x.shape[:-1], y.shape[-1])


__all__ = ["linear"]
