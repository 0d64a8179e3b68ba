"""The certified INT8 LM head: the exact head's token for a byte a weight plus a few rows.

``CertifiedHead.choose(h, sampling, requests, positions)`` gives the token
``engine.sampling.choose`` would give on the exact head's logits of the hidden states ``h``
(after the final norm), reading the head as INT8 (``w12_kernels.int8_head``): the INT8 product
bounds every logit, the entries that may still win are the candidates, and only their rows are
computed exactly, with the W12 kernels' bits for those rows (``linear_rows``). Greedy and keyed
Gumbel sampling are covered (the token rule is monotone in each logit); top-p needs every
probability, so it runs the exact head, as does a call with more than ``max_rows`` distinct
candidate rows or more rows than the small-M kernels take (``fallbacks`` counts them).

The recompute needs a W12 head on a GPU. On the CPU no kernel reproduces the exact head's bits
for a subset of its rows (BF16 ``F.linear`` sums in the BLAS library's order), so there the
candidates' logits are read from the whole exact head: the certification runs (and its
candidate counts are real), but nothing is saved.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from engine.sampling import Sampling, choose, gumbel_noise, row_keys
from engine.w12_backend import (
    decode_weight,
    int8_head,
    int8_head_candidates,
    linear_rows,
    rows_reproducible,
)
from w12.errors import W12Error

MAX_ROWS = 2048  # distinct candidate rows per call above which the exact head runs instead

_QUANTIZED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LM head -> DeviceHead


@dataclass
class HeadStats:
    calls: int = 0
    rows: int = 0  # hidden states chosen for
    candidates: int = 0  # candidate entries over those rows
    recomputed: int = 0  # distinct vocabulary rows computed exactly, over the calls
    fallbacks: int = 0  # calls that ran the whole exact head (top-p, too many candidates)

    @property
    def mean_candidates(self) -> float:
        return self.candidates / self.rows if self.rows else 0.0

    def as_dict(self) -> dict:
        return {"calls": self.calls, "rows": self.rows, "candidates": self.candidates,
                "mean_candidates": self.mean_candidates, "recomputed": self.recomputed,
                "fallbacks": self.fallbacks}


class CertifiedHead:
    """The certified INT8 head of a model's ``lm_head`` (an ``engine.model.Linear``); its INT8
    copy is made once per LM head and shared by every engine of the model."""

    def __init__(self, lm_head, *, max_rows: int = MAX_ROWS) -> None:
        on_gpu = (lm_head.packed.device if lm_head.is_w12 else lm_head.weight.device).type \
            == "cuda"
        if on_gpu and not lm_head.is_w12:
            raise W12Error("the certified INT8 head recomputes its candidates with the W12 "
                           "kernels' bits: it needs a W12 LM head on a GPU (this one is BF16)")
        if lm_head.bias is not None:
            raise W12Error("the certified INT8 head takes an LM head without a bias")
        self.lm_head, self.max_rows, self.recompute = lm_head, max_rows, on_gpu
        self.int8 = _QUANTIZED.get(lm_head)
        if self.int8 is None:
            weight = decode_weight(lm_head.packed) if lm_head.is_w12 else lm_head.weight
            self.int8 = _QUANTIZED[lm_head] = int8_head(weight)
        self.stats = HeadStats()

    def exact(self, h: torch.Tensor) -> torch.Tensor:
        """The exact head's logits [R, V] float32 (what the model's forward returns)."""
        return self.lm_head(h).float()

    @torch.inference_mode()
    def choose(self, h: torch.Tensor, sampling: Sampling, requests: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """[R] int64: ``choose(self.exact(h), sampling, requests, positions)`` for hidden
        states ``h`` [R, K] (BF16)."""
        stats = self.stats
        stats.calls += 1
        stats.rows += h.shape[0]
        if sampling.top_p < 1.0:
            stats.fallbacks += 1
            return choose(self.exact(h), sampling, requests, positions)
        noise = None
        if not sampling.greedy:
            keys = row_keys(sampling.seed, requests.long(), positions.long())
            noise = gumbel_noise(keys, self.int8.shape[0])
        cand = int8_head_candidates(self.int8, h, temperature=max(sampling.temperature, 0.0),
                                    noise=noise)
        ids = cand.any(dim=0).nonzero()[:, 0]
        stats.candidates += int(cand.sum())
        if self.recompute:
            if ids.numel() > self.max_rows or not rows_reproducible(h.shape[0], h.device):
                stats.fallbacks += 1
                return choose(self.exact(h), sampling, requests, positions)
            exact = linear_rows(h, self.lm_head.packed, ids).float()
        else:  # the CPU: the candidates' logits read from the whole exact head
            exact = self.exact(h)[:, ids]
        stats.recomputed += ids.numel()
        score = exact if noise is None else exact / sampling.temperature + noise[:, ids]
        score = score.masked_fill(~cand[:, ids], float("-inf"))
        return ids[score.argmax(dim=1)]  # ids ascend: the first maximal entry, as argmax
