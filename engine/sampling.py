"""Choosing the next token: greedy, or sampling with noise keyed by (seed, request, position).

Sampling draws with the Gumbel-max trick: the token is ``argmax(logits / T + g)`` where each
``g`` is Gumbel noise computed from a counter-based hash of (seed, request, position, token
id), restricted to the top-p nucleus first. The draw at a position therefore depends only on
that row's logits and its key, never on how many rows share the call or in which order steps
ran, so plain decoding and speculative decoding (which picks a token at every node of a draft
tree, node at depth d choosing position L + d + 1) draw the same token wherever the logits are
the same. ``temperature == 0`` is greedy (the first maximal logit).

The hash works on 32-bit words held in int64 tensors, multiplying in 16-bit halves so no
intermediate exceeds 2^49: the same integers on every device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
_C1, _C2 = 0x7FEB352D, 0x846CA68B  # the multipliers of a well-mixing 32-bit finaliser
_GOLDEN = 0x9E3779B9


@dataclass(frozen=True)
class Sampling:
    """``temperature == 0`` is greedy; otherwise softmax(logits / T) cut to the top-p mass,
    drawn with noise keyed by (``seed``, request, position)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for 32-bit x and c, without an int64 overflow."""
    hi = (((x >> 16) * c) & 0xFFFF) << 16
    return (hi + (x & 0xFFFF) * c) & _MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit finaliser: every input bit flips about half of the output bits."""
    x = x ^ (x >> 16)
    x = _mul32(x, _C1)
    x = x ^ (x >> 15)
    x = _mul32(x, _C2)
    return x ^ (x >> 16)


def combine(h: torch.Tensor, value: torch.Tensor | int) -> torch.Tensor:
    """Fold a 32-bit word into a running hash."""
    return mix32((h ^ (torch.as_tensor(value) & _MASK32)) + _GOLDEN & _MASK32)


def row_keys(seed: int, requests: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from (seed, request id, absolute position)."""
    h = mix32(torch.full_like(positions, seed & _MASK32))
    return combine(combine(h, requests), positions)


def gumbel_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, vocab] float32 Gumbel noise from the row keys [R]."""
    ids = torch.arange(vocab, device=keys.device, dtype=torch.long)
    bits = combine(keys[:, None], ids[None, :])
    u = ((bits >> 8).float() + 0.5) * 2.0**-24  # in (0, 1), exact in float32
    return -torch.log(-torch.log(u))


def row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``x.cumsum(-1)`` for [R, V] with each row's bits independent of R: on a GPU torch scans
    a lone row with another kernel (another summation order) than a batch of rows, so one row
    is scanned as the first of two."""
    if x.shape[0] == 1:
        return torch.cat([x, x]).cumsum(dim=-1)[:1]
    return x.cumsum(dim=-1)


def top_p_mask(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """[R, V] boolean: the smallest set of highest-probability tokens whose mass reaches
    ``top_p`` (the most likely token always stays)."""
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    outside = row_cumsum(sorted_probs) - sorted_probs > top_p
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, ~outside)


def choose(logits: torch.Tensor, sampling: Sampling, requests: torch.Tensor,
           positions: torch.Tensor) -> torch.Tensor:
    """The token for each row of ``logits`` [R, V] (fp32): greedy, or the keyed draw for
    row ``r`` of request ``requests[r]`` at position ``positions[r]``. Returns [R] int64."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    scaled = logits / sampling.temperature
    if sampling.top_p < 1.0:
        scaled = scaled.masked_fill(~top_p_mask(scaled, sampling.top_p), float("-inf"))
    keys = row_keys(sampling.seed, requests.long(), positions.long())
    return (scaled + gumbel_noise(keys, logits.shape[-1])).argmax(dim=-1)
