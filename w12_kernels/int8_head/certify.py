"""The certification on the device: float32 bounds that contain ``reference.logit_bounds``'s
float64 ones, and the candidate mask.

``reference.py`` states the bound in float64; here every term is float32, and each float32
operation's own rounding is covered by widening:

* the per-row norms ``err`` and ``wsum = ||s q|| + ||w||`` are float64 rounded *up* to float32
  once (``DeviceHead.of``);
* the hidden state's norm, a float32 sum of K squares in any order, is within a relative
  ``(K + 2) 2^-24`` of the float64 one: it is multiplied by ``1 + (K + 4) 2^-23``;
* the radius (three products, two sums, one more product) is within ``8 x 2^-24`` of its exact
  value: it is multiplied by ``1 + 2^-20``;
* ``approx -/+ radius`` rounds by at most ``2^-24 |result|``, and the BF16 widening's product
  by as little again: the widening uses ``U_BF16 + 2^-20`` instead of ``U_BF16``.

The product itself (``approx``) is the kernel's float32 result, which the reference's bound
already allows for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from w12_kernels.int8_head.reference import EXTRA_TERMS, SAFETY, U_BF16, U_SUM, Int8Head

GROW = 1.0 + 2.0**-20  # exact in float32


def _up(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32, rounded up."""
    y = x.float()
    return torch.where(y.double() < x, torch.nextafter(y, torch.full_like(y, float("inf"))), y)


@dataclass(frozen=True)
class DeviceHead:
    """What the device reads of an ``Int8Head``: the INT8 rows, their scales and two float32
    norms per row (rounded up)."""

    q: torch.Tensor  # int8 [V, K]
    scale: torch.Tensor  # float32 [V]
    err: torch.Tensor  # float32 [V]
    wsum: torch.Tensor  # float32 [V]: ||s q|| + ||w||

    @classmethod
    def of(cls, head: Int8Head, device: torch.device | str | None = None) -> DeviceHead:
        return cls(head.q.to(device), head.scale.to(device), _up(head.err).to(device),
                   _up(head.qnorm + head.norm).to(device))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.err,
                                                            self.wsum))


@dataclass(frozen=True)
class Widening:
    """The constants of the float32 bound for a head of K columns (module docstring)."""

    gamma: float  # the float32 sums' allowance, n u / (1 - n u)
    norm: float  # factor on the float32 norm of a hidden state
    radius: float = SAFETY * GROW  # factor on the float32 radius
    widen: float = U_BF16 + 2.0**-20  # relative widening of lo and hi
    u_sum: float = U_SUM

    @classmethod
    def of(cls, k: int) -> Widening:
        n = k + EXTRA_TERMS
        return cls(gamma=n * U_SUM / (1 - n * U_SUM), norm=(1.0 + (k + 4) * 2.0**-23) * SAFETY)


def hidden_norms(h: torch.Tensor, w: Widening) -> torch.Tensor:
    """[R] float32: each hidden state's norm, widened past its float32 rounding."""
    return h.float().norm(dim=1) * w.norm


def bounds32(head: DeviceHead, h: torch.Tensor, approx: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) [R, V] float32 around the exact head's computed logits, for hidden states ``h``
    [R, K] and the kernel's ``approx`` [R, V] (float32): each interval contains the float64
    one of ``reference.logit_bounds``. (``launcher.greedy_candidates`` computes the same in
    the INT8 product's epilogue.)"""
    w = Widening.of(head.shape[1])
    hn = hidden_norms(h, w)[:, None]
    radius = (hn * head.err[None, :] + (w.gamma * hn) * head.wsum[None, :]
              + w.u_sum * approx.abs()) * w.radius
    lo, hi = approx - radius, approx + radius
    return lo - w.widen * lo.abs(), hi + w.widen * hi.abs()
