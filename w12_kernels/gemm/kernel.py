"""Triton kernels of the W12 GEMM.

``w12_gemm_kernel`` computes ``acc[BLOCK_N, BLOCK_M] = W'_tile @ x_tile^T`` with the weight rows
on the MMA's M side ("swap AB"), so one weight tile, decoded once, serves ``NUM_CHUNKS``
activation chunks of ``BLOCK_M`` rows; the MMA shape never depends on the number of rows M.
Split-K programs write float32 partials; the last program of a row tile to arrive (an integer
ticket, no float atomics) sums them in split order 0..S-1, so the result is the same whoever
arrives last. The epilogue scales each row by ``2^(e0 - DECODE_BIAS)``, adds the escape
corrections in escape-list order and the bias, and stores BF16.

The decode turns the three int32 word planes (``layout.py``) into BF16 pairs: with inline PTX,
per pair one ``prmt`` (two low bytes plus the constant exponent bits 0x38), one shift of the
sign/exponent word and one ``lop3`` (11 integer operations per 8 weights); a plain-Triton
version with the same bits runs under ``TRITON_INTERPRET=1`` and serves as a check.
"""

from __future__ import annotations

import triton
import triton.language as tl

_DECODE_PTX = tl.constexpr("""
{
.reg .b32 a<4>, b<4>;
prmt.b32 a0, $8, 0x38383838, 0x4140;
prmt.b32 a1, $8, 0x38383838, 0x4342;
prmt.b32 a2, $9, 0x38383838, 0x4140;
prmt.b32 a3, $9, 0x38383838, 0x4342;
shl.b32 b1, $10, 4;
shl.b32 b2, $10, 8;
shf.r.wrap.b32 b3, $10, $10, 4;
lop3.b32 b0, $10, 0x87008700, a0, 0xEA;
lop3.b32 b1, b1, 0x87008700, a1, 0xEA;
lop3.b32 b2, b2, 0x87008700, a2, 0xEA;
lop3.b32 b3, b3, 0x87008700, a3, 0xEA;
mov.b32 {$0, $1}, b0;
mov.b32 {$2, $3}, b1;
mov.b32 {$4, $5}, b2;
mov.b32 {$6, $7}, b3;
}
""")



@triton.jit
def _decode_asm(hi_a, hi_b, lo, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One asm instance per group of 8 columns, 8 separate outputs: an instance must not be fed
    # broadcast words (pack > 1), because Triton treats inline asm as elementwise and would
    # move the broadcast after it.
    o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
        asm=_DECODE_PTX,
        constraints="=h,=h,=h,=h,=h,=h,=h,=h,r,r,r",
        args=[hi_a, hi_b, lo],
        dtype=(tl.bfloat16,) * 8,
        is_pure=True,
        pack=1,
    )
    # tl.join adds its axis last (innermost): column 4p + 2q + r of a group is w[..., p, q, r]
    even = tl.join(tl.join(o0, o4), tl.join(o2, o6))
    odd = tl.join(tl.join(o1, o5), tl.join(o3, o7))
    return tl.reshape(tl.join(even, odd), (BLOCK_N, BLOCK_K))


@triton.jit
def _decode_plain(lo_a, lo_b, top, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    G: tl.constexpr = BLOCK_K // 8
    byte_shift = tl.arange(0, 4) * 8
    low = tl.join(lo_a, lo_b)  # [BN, G, 2]: low bytes of columns 0..3 and 4..7
    low = tl.reshape((low[:, :, :, None] >> byte_shift[None, None, None, :]) & 255,
                     (BLOCK_N, G, 8))
    j = tl.arange(0, 8)
    pair = j // 2
    shift = tl.where(pair == 3, 4, -4 * pair)  # layout.B_POSITIONS
    base = 16 * (j % 2) + shift
    t = top[:, :, None]
    sign = (t >> ((base + 15) % 32)[None, None, :]) & 1
    e3 = (t >> ((base + 10) % 32)[None, None, :]) & 1
    e2 = (t >> ((base + 9) % 32)[None, None, :]) & 1
    e1 = (t >> ((base + 8) % 32)[None, None, :]) & 1
    bits = (sign << 15) | 0x3800 | (e3 << 10) | (e2 << 9) | (e1 << 8) | low
    bits = tl.reshape(bits, (BLOCK_N, BLOCK_K))
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _decode(hi_a, hi_b, lo, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_ASM: tl.constexpr):
    if USE_ASM:
        w = _decode_asm(hi_a, hi_b, lo, BLOCK_N, BLOCK_K)
    else:
        w = _decode_plain(hi_a, hi_b, lo, BLOCK_N, BLOCK_K)
    return w


@triton.jit
def _mma(w, xt, acc, ON_GPU: tl.constexpr):
    if ON_GPU:
        acc = tl.dot(w, xt, acc)
    else:
        # the interpreter multiplies bf16 as raw integers; float32 holds bf16 products exactly
        acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc)
    return acc


@triton.jit
def _to_bf16(y, ON_GPU: tl.constexpr):
    """Round float32 to BF16 to nearest even (the interpreter's own cast truncates)."""
    if ON_GPU:
        out = y.to(tl.bfloat16)
    else:
        bits = y.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        keep = (bits >> 16) | 0x40  # NaN stays NaN (quiet)
        bits16 = tl.where(y != y, keep, rounded)
        out = bits16.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return out


@triton.jit
def _x_tile(x_ptr, stride_xm, m_start, kk, M, K, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr):
    """x[m_start:m_start+BLOCK_M, kk]^T as [BLOCK_K, BLOCK_M], zero outside x."""
    ms = m_start + tl.arange(0, BLOCK_M)
    mask = ms[None, :] < M
    if not EVEN_K:
        mask = mask & (kk[:, None] < K)
    ptrs = x_ptr + ms[None, :].to(tl.int64) * stride_xm + kk[:, None]
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _fence(token, ON_GPU: tl.constexpr):
    """A device-scope fence in every thread (the interpreter runs programs one by one)."""
    if ON_GPU:
        tl.inline_asm_elementwise(
            "fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [token], dtype=tl.int32,
            is_pure=False, pack=1,
        )


@triton.jit
def _escape_chunk(y, e, e_end, rows, ms, m_ok, x_ptr, stride_xm, esc_row_ptr, esc_col_ptr,
                  esc_delta_ptr, ESC_CHUNK: tl.constexpr):
    offs = e + tl.arange(0, ESC_CHUNK)
    valid = offs < e_end
    row = tl.load(esc_row_ptr + offs, mask=valid, other=-1)
    col = tl.load(esc_col_ptr + offs, mask=valid, other=0)
    delta = tl.load(esc_delta_ptr + offs, mask=valid, other=0.0)
    xv = tl.load(x_ptr + ms[None, :].to(tl.int64) * stride_xm + col[:, None],
                 mask=valid[:, None] & m_ok, other=0.0)
    contrib = xv.to(tl.float32) * delta[:, None]  # [ESC_CHUNK, BLOCK_M]
    hit = row[None, :, None] == rows[:, None, None]
    # where, not a 0/1 product: an inf or NaN correction must not leak into other rows
    return y + tl.sum(tl.where(hit, contrib[None, :, :], 0.0), axis=1)


@triton.jit
def _escape_correction(y, rows, ms, x_ptr, stride_xm, M, rowptr_ptr, esc_row_ptr,
                       esc_col_ptr, esc_delta_ptr, n_start, ESC_ITERS: tl.constexpr,
                       BLOCK_N: tl.constexpr, ESC_CHUNK: tl.constexpr, ON_GPU: tl.constexpr):
    """y[n, m] += x[m, c] * delta for the escapes of rows n_start..n_start+BLOCK_N, in order.

    The interpreter (Triton 3.6 with NumPy 2) cannot loop over run-time bounds, so there the
    launcher passes the largest trip count of any row tile as ``ESC_ITERS`` and extra chunks
    are fully masked.
    """
    e_begin = tl.load(rowptr_ptr + n_start)
    e_end = tl.load(rowptr_ptr + n_start + BLOCK_N)
    m_ok = ms[None, :] < M
    if ON_GPU:
        for e in range(e_begin, e_end, ESC_CHUNK):
            y = _escape_chunk(y, e, e_end, rows, ms, m_ok, x_ptr, stride_xm, esc_row_ptr,
                              esc_col_ptr, esc_delta_ptr, ESC_CHUNK)
    else:
        for i in range(0, ESC_ITERS):
            y = _escape_chunk(y, e_begin + i * ESC_CHUNK, e_end, rows, ms, m_ok, x_ptr,
                              stride_xm, esc_row_ptr, esc_col_ptr, esc_delta_ptr, ESC_CHUNK)
    return y


@triton.jit
def _finish(acc, rows, m_start, x_ptr, stride_xm, M, N, scale_ptr, bias_ptr, out_ptr,
            stride_om, rowptr_ptr, esc_row_ptr, esc_col_ptr, esc_delta_ptr, n_start,
            ESC_ITERS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_M: tl.constexpr, ESC_CHUNK: tl.constexpr, ON_GPU: tl.constexpr):
    ms = m_start + tl.arange(0, BLOCK_M)
    y = acc * tl.load(scale_ptr + rows)[:, None]
    y = _escape_correction(y, rows, ms, x_ptr, stride_xm, M, rowptr_ptr, esc_row_ptr,
                           esc_col_ptr, esc_delta_ptr, n_start, ESC_ITERS, BLOCK_N, ESC_CHUNK,
                           ON_GPU)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[:, None]
    ptrs = out_ptr + ms[None, :].to(tl.int64) * stride_om + rows[:, None]
    tl.store(ptrs, _to_bf16(y, ON_GPU), mask=(ms[None, :] < M) & (rows[:, None] < N))


@triton.jit
def _store_partial(acc, part_ptr, split, rows, m_start, M, NP, BLOCK_M: tl.constexpr):
    ms = m_start + tl.arange(0, BLOCK_M)
    base = part_ptr + split.to(tl.int64) * M * NP
    tl.store(base + ms[None, :].to(tl.int64) * NP + rows[:, None], acc, mask=ms[None, :] < M)


@triton.jit
def _sum_partials(part_ptr, rows, m_start, M, NP, split_k, BLOCK_M: tl.constexpr,
                  SPLIT_ITERS: tl.constexpr, ON_GPU: tl.constexpr):
    ms = m_start + tl.arange(0, BLOCK_M)
    offs = ms[None, :].to(tl.int64) * NP + rows[:, None]
    mask = ms[None, :] < M
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    if ON_GPU:
        for s in range(1, split_k):  # fixed order: split 0, 1, 2, ...
            acc += tl.load(part_ptr + s * M * NP + offs, mask=mask, other=0.0,
                           cache_modifier=".cg")
    else:
        for s in range(1, SPLIT_ITERS):
            acc += tl.load(part_ptr + s * M * NP + offs, mask=mask, other=0.0)
    return acc


@triton.jit
def _k_step(kb, word, plane, x_ptr, stride_xm, m_start, M, K, acc0, acc1, acc2, acc3,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
            NUM_CHUNKS: tl.constexpr, EVEN_K: tl.constexpr, USE_ASM: tl.constexpr,
            ON_GPU: tl.constexpr):
    """One K block: decode the weight tile once, multiply it into every activation chunk."""
    G: tl.constexpr = BLOCK_K // 8
    hi_a = tl.load(word + kb * G)
    hi_b = tl.load(word + plane + kb * G)
    lo = tl.load(word + 2 * plane + kb * G)
    w = _decode(hi_a, hi_b, lo, BLOCK_N, BLOCK_K, USE_ASM)
    kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    acc0 = _mma(w, _x_tile(x_ptr, stride_xm, m_start, kk, M, K, BLOCK_M, EVEN_K), acc0, ON_GPU)
    if NUM_CHUNKS > 1:
        xt = _x_tile(x_ptr, stride_xm, m_start + BLOCK_M, kk, M, K, BLOCK_M, EVEN_K)
        acc1 = _mma(w, xt, acc1, ON_GPU)
    if NUM_CHUNKS > 2:
        xt = _x_tile(x_ptr, stride_xm, m_start + 2 * BLOCK_M, kk, M, K, BLOCK_M, EVEN_K)
        acc2 = _mma(w, xt, acc2, ON_GPU)
    if NUM_CHUNKS > 3:
        xt = _x_tile(x_ptr, stride_xm, m_start + 3 * BLOCK_M, kk, M, K, BLOCK_M, EVEN_K)
        acc3 = _mma(w, xt, acc3, ON_GPU)
    return acc0, acc1, acc2, acc3


@triton.jit(do_not_specialize=["M", "kb_per_split", "kb_total", "split_k"])
def w12_gemm_kernel(
    x_ptr, planes_ptr, scale_ptr, rowptr_ptr, esc_row_ptr, esc_col_ptr, esc_delta_ptr,
    bias_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, NP, GROUPS, stride_xm, stride_om, kb_per_split, kb_total, split_k,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr, NUM_CHUNKS: tl.constexpr, SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr, USE_ASM: tl.constexpr, ON_GPU: tl.constexpr,
    ESC_CHUNK: tl.constexpr, KB_ITERS: tl.constexpr, SPLIT_ITERS: tl.constexpr,
    ESC_ITERS: tl.constexpr,
):
    """See the module docstring. ``KB_ITERS``, ``SPLIT_ITERS`` and ``ESC_ITERS`` are the loop
    trip counts for the interpreter only (0 on the GPU, where the loops use run-time bounds)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    n_start = pid_n * BLOCK_N
    m_start = pid_m * (BLOCK_M * NUM_CHUNKS)
    rows = n_start + tl.arange(0, BLOCK_N)
    G: tl.constexpr = BLOCK_K // 8
    word = planes_ptr + rows[:, None] * GROUPS + tl.arange(0, G)[None, :]
    plane = NP * GROUPS
    acc0 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    kb_begin = pid_k * kb_per_split
    if ON_GPU:
        for i in range(0, kb_per_split):  # the launcher splits K evenly
            acc0, acc1, acc2, acc3 = _k_step(
                kb_begin + i, word, plane, x_ptr, stride_xm, m_start, M, K, acc0, acc1, acc2,
                acc3, BLOCK_N, BLOCK_K, BLOCK_M, NUM_CHUNKS, EVEN_K, USE_ASM, ON_GPU)
    else:
        for i in range(0, KB_ITERS):
            acc0, acc1, acc2, acc3 = _k_step(
                kb_begin + i, word, plane, x_ptr, stride_xm, m_start, M, K, acc0, acc1, acc2,
                acc3, BLOCK_N, BLOCK_K, BLOCK_M, NUM_CHUNKS, EVEN_K, USE_ASM, ON_GPU)

    if SPLIT:
        _store_partial(acc0, part_ptr, pid_k, rows, m_start, M, NP, BLOCK_M)
        if NUM_CHUNKS > 1:
            _store_partial(acc1, part_ptr, pid_k, rows, m_start + BLOCK_M, M, NP, BLOCK_M)
        if NUM_CHUNKS > 2:
            _store_partial(acc2, part_ptr, pid_k, rows, m_start + 2 * BLOCK_M, M, NP, BLOCK_M)
        if NUM_CHUNKS > 3:
            _store_partial(acc3, part_ptr, pid_k, rows, m_start + 3 * BLOCK_M, M, NP, BLOCK_M)
        _fence(pid_k, ON_GPU)
        tl.debug_barrier()
        counter = count_ptr + pid_n * tl.num_programs(1) + pid_m
        ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        is_last = ticket == split_k - 1
        _fence(pid_k, ON_GPU)
        if is_last:
            # every split of this tile has arrived: rearm the counter for the next launch,
            # whatever split it uses
            tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
            acc0 = _sum_partials(part_ptr, rows, m_start, M, NP, split_k, BLOCK_M, SPLIT_ITERS,
                                 ON_GPU)
            if NUM_CHUNKS > 1:
                acc1 = _sum_partials(part_ptr, rows, m_start + BLOCK_M, M, NP, split_k, BLOCK_M,
                                     SPLIT_ITERS, ON_GPU)
            if NUM_CHUNKS > 2:
                acc2 = _sum_partials(part_ptr, rows, m_start + 2 * BLOCK_M, M, NP, split_k,
                                     BLOCK_M, SPLIT_ITERS, ON_GPU)
            if NUM_CHUNKS > 3:
                acc3 = _sum_partials(part_ptr, rows, m_start + 3 * BLOCK_M, M, NP, split_k,
                                     BLOCK_M, SPLIT_ITERS, ON_GPU)
    else:
        is_last = pid_k == 0

    if is_last:
        _finish(acc0, rows, m_start, x_ptr, stride_xm, M, N, scale_ptr, bias_ptr, out_ptr,
                stride_om, rowptr_ptr, esc_row_ptr, esc_col_ptr, esc_delta_ptr, n_start,
                ESC_ITERS, HAS_BIAS, BLOCK_N, BLOCK_M, ESC_CHUNK, ON_GPU)
        if NUM_CHUNKS > 1:
            _finish(acc1, rows, m_start + BLOCK_M, x_ptr, stride_xm, M, N, scale_ptr, bias_ptr,
                    out_ptr, stride_om, rowptr_ptr, esc_row_ptr, esc_col_ptr, esc_delta_ptr,
                    n_start, ESC_ITERS, HAS_BIAS, BLOCK_N, BLOCK_M, ESC_CHUNK, ON_GPU)
        if NUM_CHUNKS > 2:
            _finish(acc2, rows, m_start + 2 * BLOCK_M, x_ptr, stride_xm, M, N, scale_ptr,
                    bias_ptr, out_ptr, stride_om, rowptr_ptr, esc_row_ptr, esc_col_ptr,
                    esc_delta_ptr, n_start, ESC_ITERS, HAS_BIAS, BLOCK_N, BLOCK_M, ESC_CHUNK,
                    ON_GPU)
        if NUM_CHUNKS > 3:
            _finish(acc3, rows, m_start + 3 * BLOCK_M, x_ptr, stride_xm, M, N, scale_ptr,
                    bias_ptr, out_ptr, stride_om, rowptr_ptr, esc_row_ptr, esc_col_ptr,
                    esc_delta_ptr, n_start, ESC_ITERS, HAS_BIAS, BLOCK_N, BLOCK_M, ESC_CHUNK,
                    ON_GPU)


@triton.jit
def w12_decode_kernel(planes_ptr, scale_ptr, out_ptr, N, K, NP, GROUPS,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_ASM: tl.constexpr):
    """out[n, k] = W'[n, k] * 2^(e0 - DECODE_BIAS): the in-window weights as BF16.

    Escapes come out as the value of record 0; the launcher patches them afterwards.
    """
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    G: tl.constexpr = BLOCK_K // 8
    groups = tl.program_id(1) * G + tl.arange(0, G)
    word = planes_ptr + rows[:, None] * GROUPS + groups[None, :]
    plane = NP * GROUPS
    w = _decode(tl.load(word), tl.load(word + plane), tl.load(word + 2 * plane),
                BLOCK_N, BLOCK_K, USE_ASM)
    w = (w.to(tl.float32) * tl.load(scale_ptr + rows)[:, None]).to(tl.bfloat16)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ptrs = out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :]
    tl.store(ptrs, w, mask=(rows[:, None] < N) & (cols[None, :] < K))
