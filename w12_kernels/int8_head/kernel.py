"""Triton kernel of the certified INT8 head: the approximate logits ``scale[v] * (h . q[v])``
of BF16 hidden states against INT8 weight rows (every INT8 value is exact in BF16, so the MMA
runs on BF16 operands with float32 sums, one byte read a weight). With ``CERTIFY`` the epilogue
turns them into the greedy certification's inputs instead: every entry's upper bound and each
program's best lower bound per row, the float32 arithmetic of ``certify.bounds32``."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def int8_head_kernel(h_ptr, q_ptr, scale_ptr, out_ptr, R, V, K, sh_r, sq_v, so_r,
                     err_ptr, wsum_ptr, hn_ptr, best_ptr, sb_r, gamma, u_sum, grow, widen,
                     BR: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
                     ON_GPU: tl.constexpr, CERTIFY: tl.constexpr):
    """One program per block of ``BV`` vocabulary rows and ``BR`` hidden states: the INT8
    rows converted to BF16 in registers, one dot product per K block, float32 sums, the row
    scale once at the end. ``CERTIFY``: ``out`` gets each entry's upper bound and
    ``best[row, block]`` the block's largest lower bound (``hn``: each row's widened norm)."""
    vb = tl.program_id(0)
    rb = tl.program_id(1)
    rows = rb * BR + tl.arange(0, BR)
    vocab = vb * BV + tl.arange(0, BV)
    acc = tl.zeros((BR, BV), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        h = tl.load(h_ptr + rows[:, None].to(tl.int64) * sh_r + ks[None, :],
                    mask=(rows[:, None] < R) & (ks[None, :] < K), other=0.0)
        q = tl.load(q_ptr + vocab[None, :].to(tl.int64) * sq_v + ks[:, None],
                    mask=(vocab[None, :] < V) & (ks[:, None] < K), other=0)
        if ON_GPU:
            acc = tl.dot(h, q.to(tl.bfloat16), acc)
        else:  # the interpreter multiplies bf16 as raw integers (and casts int8 to bf16
            # wrongly): float32 holds the same products exactly
            acc = tl.dot(h.to(tl.float32), q.to(tl.float32), acc, input_precision="ieee")
    scale = tl.load(scale_ptr + vocab, mask=vocab < V, other=0.0)
    out = acc * scale[None, :]
    inside = (rows[:, None] < R) & (vocab[None, :] < V)
    if CERTIFY:  # certify.bounds32, term for term
        err = tl.load(err_ptr + vocab, mask=vocab < V, other=0.0)
        wsum = tl.load(wsum_ptr + vocab, mask=vocab < V, other=0.0)
        hn = tl.load(hn_ptr + rows, mask=rows < R, other=0.0)
        radius = (hn[:, None] * err[None, :] + (gamma * hn)[:, None] * wsum[None, :]
                  + u_sum * tl.abs(out)) * grow
        lo = out - radius
        lo = lo - widen * tl.abs(lo)
        hi = out + radius
        out = hi + widen * tl.abs(hi)
        best = tl.max(tl.where(inside, lo, float("-inf")), axis=1)
        tl.store(best_ptr + rows.to(tl.int64) * sb_r + vb, best, mask=rows < R)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * so_r + vocab[None, :], out, mask=inside)
