"""The certified INT8 LM head: the exact head's token for a byte a weight plus a few rows.

``CertifiedHead.choose(h, sampling, requests, positions)`` gives the token
``engine.sampling.choose`` would give on the exact head's logits of the hidden states ``h``
(after the final norm), reading the head as INT8 (``w12_kernels.int8_head``): the INT8 product
bounds every logit, the entries that may still win are the candidates, and only their rows are
computed exactly, with the W12 kernels' bits for those rows. Greedy and keyed Gumbel sampling
are covered (the token rule is monotone in each logit); top-p needs every probability, so it
runs the exact head, as does a call whose candidates span more than ``max_tiles`` 16-row tiles
or with more rows than the small-M kernels take (``fallbacks`` counts them).

On a GPU the choice runs with fixed shapes and no read-back (``int8_head_picks``: the
candidates' tiles, ``max_tiles`` of them, recomputed from the W12 head), then one read of the
tiles the candidates needed decides whether the exact head must run instead; the counts of
``stats`` stay on the device until read.

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
    int8_head_picks,
    rows_reproducible,
    tile_escapes,
)
from w12.errors import W12Error

MAX_TILES = 256  # 16-row tiles of candidates a call recomputes (4,096 of the vocabulary's
# rows); candidates spanning more run the exact head instead

_QUANTIZED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LM head -> DeviceHead


@dataclass
class HeadStats:
    calls: int = 0
    rows: int = 0  # hidden states chosen for
    candidates: int = 0  # candidate entries over those rows
    recomputed: int = 0  # vocabulary rows computed exactly (whole 16-row tiles), over the calls
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

    def __init__(self, lm_head, *, max_tiles: int = MAX_TILES) -> None:
        on_gpu = (lm_head.packed.device if lm_head.is_w12 else lm_head.weight.device).type \
            == "cuda"
        if on_gpu and not lm_head.is_w12:
            raise W12Error("the certified INT8 head recomputes its candidates with the W12 "
                           "kernels' bits: it needs a W12 LM head on a GPU (this one is BF16)")
        if lm_head.bias is not None:
            raise W12Error("the certified INT8 head takes an LM head without a bias")
        self.lm_head, self.max_tiles, self.recompute = lm_head, max_tiles, on_gpu
        self.int8 = _QUANTIZED.get(lm_head)
        if self.int8 is None:
            weight = decode_weight(lm_head.packed) if lm_head.is_w12 else lm_head.weight
            self.int8 = _QUANTIZED[lm_head] = int8_head(weight)
        self.tile_escapes = tile_escapes(lm_head.packed) if on_gpu else 0
        self._stats = HeadStats()
        self._counts = torch.zeros(2, dtype=torch.long, device=self.int8.q.device)  # on the
        # device: candidates, rows recomputed

    @property
    def stats(self) -> HeadStats:
        """The counts so far (reading them waits for the device)."""
        candidates, recomputed = self._counts.tolist()
        s = self._stats
        return HeadStats(s.calls, s.rows, s.candidates + candidates,
                         s.recomputed + recomputed, s.fallbacks)

    def reset_stats(self) -> None:
        self._stats = HeadStats()
        self._counts.zero_()

    def exact(self, h: torch.Tensor) -> torch.Tensor:
        """The exact head's logits [R, V] float32 (what the model's forward returns)."""
        return self.lm_head(h).float()

    @torch.inference_mode()
    def choose(self, h: torch.Tensor, sampling: Sampling, requests: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """[R] int64: ``choose(self.exact(h), sampling, requests, positions)`` for hidden
        states ``h`` [R, K] (BF16)."""
        stats = self._stats
        stats.calls += 1
        stats.rows += h.shape[0]
        if sampling.top_p < 1.0:
            stats.fallbacks += 1
            return choose(self.exact(h), sampling, requests, positions)
        noise = None
        if not sampling.greedy:
            keys = row_keys(sampling.seed, requests.long(), positions.long())
            noise = gumbel_noise(keys, self.int8.shape[0])
        temperature = max(sampling.temperature, 0.0)
        cand = int8_head_candidates(self.int8, h, temperature=temperature, noise=noise)
        self._counts[0] += cand.sum()
        if self.recompute:
            if not rows_reproducible(h.shape[0], h.device):
                stats.fallbacks += 1
                return choose(self.exact(h), sampling, requests, positions)
            picks, needed = int8_head_picks(h, cand, self.lm_head.packed, self.max_tiles,
                                            self.max_tiles * self.tile_escapes,
                                            temperature=temperature, noise=noise)
            if bool(needed > self.max_tiles):  # the one read-back
                stats.fallbacks += 1
                return choose(self.exact(h), sampling, requests, positions)
            self._counts[1] += needed * 16
            return picks
        ids = cand.any(dim=0).nonzero()[:, 0]  # the CPU: the candidates' logits read from
        exact = self.exact(h)[:, ids]  # the whole exact head
        stats.recomputed += ids.numel()
        score = exact if noise is None else exact / sampling.temperature + noise[:, ids]
        score = score.masked_fill(~cand[:, ids], float("-inf"))
        return ids[score.argmax(dim=1)]  # ids ascend: the first maximal entry, as argmax
