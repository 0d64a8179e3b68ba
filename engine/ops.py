"""The small tensor functions of the decoder: RoPE, SwiGLU, attention over the cache (and the
row norms of ``w12_kernels.norm``).

They follow the Hugging Face reference numerics (norm statistics in fp32, products in the
activation dtype) so that a model built here matches ``transformers`` to rounding. On a GPU
``OpSet(compiled=True)`` swaps the elementwise ones for ``torch.compile``d versions: each is a
pure function of tensors, so it compiles once per shape and is reused by every layer, which
keeps compile time in seconds while fusing the small kernels a decode step would otherwise
launch. GEMMs and the attention matmuls stay plain torch calls. Which set a model
runs is per instance (``OpSet``), so a target and a drafter with different settings share a
process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.w12_backend import add_rms_norm, rms_norm


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x [B, T, H, D] in the half-split layout of HF checkpoints: pairs (i, i + D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q [B, T, Hq, D] and k [B, T, Hkv, D]."""
    return rope(q, cos, sin), rope(k, cos, sin)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def masked_softmax(scores: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax over the last dim in fp32, hidden slots at -inf, result in the scores' dtype."""
    scores = (scores * scale).masked_fill(~visible, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


def cached_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor,
    pos: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of queries ``q`` [B, T, Hq, D] over a cache [B, Hkv, S, D].

    ``visible`` [B, T, S] says which cache slots each query sees. Grouped-query heads are
    folded into the query rows ([B, Hkv, G*T, D]), so the cache is read once per KV head and
    never expanded to Hq heads.
    """
    b, t, hq, d = q.shape
    hkv, s = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    q = q.reshape(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    scores = (q @ k_cache.transpose(-1, -2)).view(b, hkv, g, t, s)
    probs = masked_softmax(scores, visible[:, None, None], d**-0.5)
    out = probs.view(b, hkv, g * t, s) @ v_cache
    return out.view(b, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, hq * d)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of a prefill chunk over itself: q [B, T, Hq, D], k/v [B, T, Hkv, D]."""
    b, t, hq, d = q.shape
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(b, t, hq * d)


class OpSet:
    """The functions one model instance runs: the elementwise ones eager or ``torch.compile``d
    (``compiled=True``; compiled once per process and shared by the instances that ask). The
    norms are always ``w12_kernels.norm``'s, whose row bits do not depend on the row count (a
    compiled reduction may pick its schedule from it)."""

    def __init__(self, compiled: bool = False) -> None:
        self.compiled = compiled
        table = _compiled_table() if compiled else _EAGER
        self.rms_norm, self.add_rms_norm = rms_norm, add_rms_norm
        self.rope_qk, self.swiglu = table["rope_qk"], table["swiglu"]
        self.masked_softmax = table["masked_softmax"]


_EAGER = {"rope_qk": rope_qk, "swiglu": swiglu, "masked_softmax": masked_softmax}
_compiled: dict[str, object] = {}


def _compiled_table() -> dict[str, object]:
    if not _compiled:
        _compiled.update({name: torch.compile(fn, dynamic=None) for name, fn in _EAGER.items()})
    return _compiled
