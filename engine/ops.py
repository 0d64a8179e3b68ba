"""The small tensor functions of the decoder: RMSNorm, RoPE, SwiGLU, attention over the cache.

They follow the Hugging Face reference numerics (norm statistics in fp32, products in the
activation dtype) so that a model built here matches ``transformers`` to rounding. On a GPU
``use_compiled(True)`` swaps the elementwise ones for ``torch.compile``d versions: each is a
pure function of tensors, so it compiles once per shape and is reused by every layer, which
keeps compile time in seconds while fusing the dozens of tiny kernels a decode step would
otherwise launch. GEMMs and the attention matmuls stay plain torch calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


rms_norm_eager = rms_norm  # the building block of the fused functions below


def add_rms_norm(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum ``x + y`` and its RMSNorm, one fused kernel when compiled."""
    s = x + y
    return s, rms_norm_eager(s, weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # RoPE in the half-split layout of HF checkpoints: pairs are (i, i + D/2)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rope_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q [B, T, Hq, D] and k [B, T, Hkv, D], after Qwen3's per-head RMSNorm if given."""
    if q_norm is not None:
        q, k = rms_norm_eager(q, q_norm, eps), rms_norm_eager(k, k_norm, eps)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def masked_softmax(scores: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax over the last dim in fp32, hidden slots at -inf, result in the scores' dtype."""
    scores = (scores * scale).masked_fill(~visible, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


_triton_attention = False


def use_triton_attention(enabled: bool) -> None:
    """Route ``cached_attention`` through the one-launch Triton kernel (``attention_triton``)
    when the caller passes positions, or through the torch ops below (default)."""
    global _triton_attention
    _triton_attention = enabled


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> bool:
    """With ``use_triton_attention(True)`` and CUDA tensors the kernel takes: the new rows
    ``k``, ``v`` [B, T, Hkv, D] into cache slots ``pos`` [B, T] in one Triton launch
    (``attention_triton.write_kv``; the same bits as ``scatter_``), returning True; else False
    (the caller scatters)."""
    if not (_triton_attention and k.is_cuda):
        return False
    from engine.attention_triton import kv_write_fits
    from engine.attention_triton import write_kv as triton_write_kv

    if not (kv_write_fits(k_cache, k) and kv_write_fits(v_cache, v)):
        return False
    triton_write_kv(k_cache, v_cache, pos, k, v)
    return True


def cached_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor,
    pos: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of queries ``q`` [B, T, Hq, D] over a cache [B, Hkv, S, D].

    ``visible`` [B, T, S] says which cache slots each query sees. Grouped-query heads are
    folded into the query rows ([B, Hkv, G*T, D]), so the cache is read once per KV head and
    never expanded to Hq heads. With ``use_triton_attention(True)``, ``pos`` [B, T] given
    (``visible`` must then be ``slots <= pos``) and at most ``MAX_ROWS`` query rows per KV
    head (decode and short verification steps), one Triton kernel does it all.
    """
    if _triton_attention and pos is not None:
        from engine.attention_triton import MAX_ROWS, decode_attention

        if q.shape[1] * (q.shape[2] // k_cache.shape[1]) <= MAX_ROWS:
            return decode_attention(q, k_cache, v_cache, pos)
    b, t, hq, d = q.shape
    hkv, s = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    q = q.reshape(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    scores = (q @ k_cache.transpose(-1, -2)).view(b, hkv, g, t, s)
    probs = _masked_softmax(scores, visible[:, None, None], d**-0.5)
    out = probs.view(b, hkv, g * t, s) @ v_cache
    return out.view(b, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, hq * d)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of a prefill chunk over itself: q [B, T, Hq, D], k/v [B, T, Hkv, D]."""
    b, t, hq, d = q.shape
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(b, t, hq * d)


_EAGER = {
    "rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "rope_qk": rope_qk, "swiglu": swiglu,
    "masked_softmax": masked_softmax,
}
_masked_softmax = masked_softmax
_compiled: dict[str, object] = {}


def use_compiled(enabled: bool) -> None:
    """Route the elementwise functions through ``torch.compile`` (``True``) or eager torch."""
    global rms_norm, add_rms_norm, rope_qk, swiglu, _masked_softmax
    table = dict(_EAGER)
    if enabled:
        if not _compiled:
            _compiled.update({name: torch.compile(fn, dynamic=None) for name, fn in _EAGER.items()})
        table = dict(_compiled)
    rms_norm, add_rms_norm, rope_qk = table["rms_norm"], table["add_rms_norm"], table["rope_qk"]
    swiglu, _masked_softmax = table["swiglu"], table["masked_softmax"]
