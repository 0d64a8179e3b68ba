"""Attention of the decode step over the static KV cache as one Triton kernel per layer.

The torch path (``ops.cached_attention``) runs a permute copy, ``q @ K^T`` (on small shapes
cuBLAS picks a float32 split kernel), the masked softmax and ``probs @ V``: four or more
launches per layer and a pass over the whole static cache. This kernel does one launch per
layer: one program per (request, KV head) holds the ``G * T`` query rows of that KV group
(grouped-query heads folded into rows, so the cache is read once per KV head), walks the
cache in blocks of ``BLOCK_S`` slots only up to the last position any of its rows sees, and
keeps an online softmax in float32 (running max and sum, rescaled per block).

Slot ``s`` is visible to the query at position ``p`` when ``s <= p`` (the causal rule the model
builds its mask from). Scores and the softmax stay in float32 (the torch path rounds the scores
to the activation dtype first), so the two paths agree to rounding, not bit for bit; the test
holds both to an error budget against a float64 reference.

The engine attends through the tree-attention kernels (``w12_kernels.tree_attention``, whose
rows keep their bits whatever else shares the call); ``decode_attention`` is the baseline
``benchmarks/tree_attention.py`` times them against at one node, and ``write_kv`` is the cache
write of ``engine.cache.KVCache``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_S = 64
MAX_ROWS = 64  # query rows per KV head (G * T) the kernel takes: its accumulator is [rows, D]


@triton.jit
def _attend_block(i, q, p_row, kv_len, k_base, v_base, sk_s, sv_s, scale, m, l_sum, acc,
                  D: tl.constexpr, BLOCK_S: tl.constexpr, ON_GPU: tl.constexpr):
    """Online-softmax update of (running max, running sum, accumulator) with cache block i."""
    s = i * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    live = s < kv_len
    k = tl.load(k_base + s[:, None] * sk_s + d[None, :], mask=live[:, None], other=0.0)
    v = tl.load(v_base + s[:, None] * sv_s + d[None, :], mask=live[:, None], other=0.0)
    if ON_GPU:
        scores = tl.dot(q, tl.trans(k))
    else:  # the interpreter multiplies bf16 as raw integers; float32 holds the products
        scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    visible = (s[None, :] <= p_row[:, None]) & live[None, :]
    scores = tl.where(visible, scores * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet
    alpha = tl.exp(m - m_safe)
    p = tl.exp(scores - m_safe[:, None])
    l_sum = l_sum * alpha + tl.sum(p, axis=1)
    if ON_GPU:
        pv = tl.dot(p.to(v.dtype), v)
    else:
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))
    return m_new, l_sum, acc * alpha[:, None] + pv


@triton.jit(do_not_specialize=["T", "S"])
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr,
    sq_b, sq_t, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_t,
    T, S, scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
    ON_GPU: tl.constexpr, S_BLOCKS: tl.constexpr,
):
    """One program per (request, KV head); ``S_BLOCKS`` is the interpreter's trip count (it
    cannot loop to a bound computed in the kernel), unused on the GPU."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, D)
    g, t = r // T, r % T  # row g * T + t: query head h * G + g at step t
    row_ok = r < G * T
    head = h * G + g
    q = tl.load(q_ptr + b * sq_b + t[:, None] * sq_t + head[:, None] * sq_h + d[None, :],
                mask=row_ok[:, None], other=0.0)
    p_row = tl.load(pos_ptr + b * T + t, mask=row_ok, other=-1)  # position of each row
    kv_len = tl.minimum(tl.max(p_row, axis=0) + 1, S)

    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, D), tl.float32)
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h
    if ON_GPU:
        for i in range(0, tl.cdiv(kv_len, BLOCK_S)):
            m, l_sum, acc = _attend_block(i, q, p_row, kv_len, k_base, v_base, sk_s, sv_s,
                                          scale, m, l_sum, acc, D, BLOCK_S, ON_GPU)
    else:
        for i in range(0, S_BLOCKS):  # blocks past kv_len are all masked: no change
            m, l_sum, acc = _attend_block(i, q, p_row, kv_len, k_base, v_base, sk_s, sv_s,
                                          scale, m, l_sum, acc, D, BLOCK_S, ON_GPU)
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    tl.store(out_ptr + b * so_b + t[:, None] * so_t + (head[:, None] * D + d[None, :]),
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     pos: torch.Tensor, *, kernel=None) -> torch.Tensor:
    """Attention of queries ``q`` [B, T, Hq, D] at positions ``pos`` [B, T] over a cache
    [B, Hkv, S, D], each query seeing the slots ``s <= pos``; returns [B, T, Hq * D].

    ``kernel`` is the jitted kernel to launch (tests pass an interpreted copy)."""
    b, t, hq, d = q.shape
    hkv, s = k_cache.shape[1], k_cache.shape[2]
    if hq % hkv or d & (d - 1) or d < 16:
        raise ValueError(f"decode_attention: {hq} query heads over {hkv} KV heads of dim {d} "
                         "(needs a whole group per KV head and a power-of-two dim >= 16)")
    g = hq // hkv
    if g * t > MAX_ROWS:
        raise ValueError(f"decode_attention: {g * t} query rows per KV head, at most {MAX_ROWS}")
    if q.stride(3) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("decode_attention: the head dimension must be contiguous")
    out = torch.empty((b, t, hq * d), dtype=q.dtype, device=q.device)
    pos = pos.contiguous()  # int64 as the model keeps it: no conversion kernel per layer
    on_gpu = q.device.type == "cuda"
    block_r = max(16, triton.next_power_of_2(g * t))
    (kernel or _decode_attention_kernel)[(b, hkv)](
        q, k_cache, v_cache, pos, out,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), t, s, d**-0.5,
        G=g, D=d, BLOCK_R=block_r, BLOCK_S=BLOCK_S, ON_GPU=on_gpu,
        S_BLOCKS=0 if on_gpu else triton.cdiv(s, BLOCK_S),
    )
    return out


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, pos_ptr,
    sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, skc_b, skc_h, skc_s, svc_b, svc_h, svc_s,
    T, D: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """One program per (request, KV head, block of ``BLOCK_T`` steps): each step's key and
    value rows into cache slot ``pos[b, t]``."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, D)
    live = (t < T)[:, None]
    slot = tl.load(pos_ptr + b * T + t, mask=t < T, other=0)[:, None]
    k = tl.load(k_ptr + b * sk_b + t[:, None] * sk_t + h * sk_h + d[None, :], mask=live)
    v = tl.load(v_ptr + b * sv_b + t[:, None] * sv_t + h * sv_h + d[None, :], mask=live)
    tl.store(kc_ptr + b * skc_b + h * skc_h + slot * skc_s + d[None, :], k, mask=live)
    tl.store(vc_ptr + b * svc_b + h * svc_h + slot * svc_s + d[None, :], v, mask=live)


def kv_write_fits(k_cache: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether ``write_kv`` takes these tensors: a power-of-two head dim, contiguous in the
    cache and in the new rows."""
    d = k.shape[-1]
    return (d & (d - 1)) == 0 and d >= 16 and k.stride(3) == 1 and k_cache.stride(3) == 1


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, *, kernel=None) -> None:
    """``k_cache[b, :, pos[b, t]] = k[b, t]`` (and the same for v) for a cache [B, Hkv, S, D]
    and new rows ``k``, ``v`` [B, T, Hkv, D]: one launch for both, where ``scatter_`` takes two
    launches that read an int64 index per element (~4 us each at batch 32 on an H200,
    docs/notebook/engine.md). A copy: the cache holds the same bits either way. Positions must be
    distinct within a row (as ``scatter_`` needs them for a defined result) and inside the
    cache: the kernel does not check them (``Engine.prefill`` and ``Engine.step`` refuse work
    past the last slot before anything runs)."""
    b, t, h, d = k.shape
    if not kv_write_fits(k_cache, k) or not kv_write_fits(v_cache, v):
        raise ValueError(f"write_kv: head dim {d} (power of two >= 16) and contiguous rows "
                         "needed")
    pos = pos.contiguous()
    block_t = min(16, triton.next_power_of_2(t))
    (kernel or _kv_write_kernel)[(b, h, triton.cdiv(t, block_t))](
        k, v, k_cache, v_cache, pos,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        t, D=d, BLOCK_T=block_t,
    )
