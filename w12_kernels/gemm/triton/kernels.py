"""Triton kernels of the W12 GEMM on the chunk layout of ``layout.py`` (the portable path).

``w12_gemm_kernel`` computes ``y = x @ W^T`` with the semantics of the CUDA kernel
``w12_gemm_small`` (``kernels.cu``), for any M: one program per (``ROWS`` weight rows, ``BLOCK_M``
activation rows); the 64-column chunks of K are dealt to ``KW`` partial sums like the CUDA
kernel's warps (sum ``w`` takes chunks ``w, w + KW, w + 2 KW, ...``), each accumulated in
float32 on its own, then added in order 0..KW-1, so the reduction order depends on the weight
shape only. The epilogue scales each row by
``2^(e0 - DECODE_BIAS)``, adds the escape corrections of each row in list order, then the bias,
and rounds to BF16 (to nearest even, also under the interpreter).

The decode is plain Triton: each element of a [ROWS, 64] block gathers the word holding its low
byte and the word holding its sign/exponent bits, undoes the shift of its pair (``B_POSITIONS``:
none, << 4, << 8, rotate right 4) and puts the constant exponent bits 0x3800 in, the same bits as
the CUDA ``decode8``. On the GPU ``tl.dot`` multiplies BF16; under ``TRITON_INTERPRET=1`` the
operands go through float32 (the interpreter multiplies BF16 as raw integers).

Loops over run-time bounds are not supported by the interpreter of some Triton versions, so
with ``ON_GPU = False`` the launcher passes the trip counts as constants (``CHUNK_ITERS``,
``ESC_ITERS``) and the results of surplus iterations are dropped.
"""

from __future__ import annotations

import triton
import triton.language as tl

from w12_kernels.gemm import layout

CHUNK_WORDS = tl.constexpr(layout.CHUNK_WORDS)  # 3 word planes x 32 lanes x 4 steps


@triton.jit
def _fragment_offsets(ROWS: tl.constexpr):
    """Where each element (r, c) of a [ROWS, 64] block of chunks lives (layout.py docstring).

    Returns the word offset of its low byte and of its sign/exponent word inside the chunk, the
    shift of its low byte, the shift pair (0..3) and the 16-bit half (0, 1) of its value.
    """
    r = tl.arange(0, ROWS)[:, None] % 16
    c = tl.arange(0, 64)[None, :]
    g, h = r % 8, r // 8  # row g + 8 h of the chunk
    t, j, pb, e = c // 16, (c // 4) % 4, (c // 2) % 2, c % 2  # col 16 t + 4 j + 2 pb + e
    lane_step = (4 * g + t) * 4 + j
    low_word = pb * 128 + lane_step  # word plane q = pb holds weights i = 4 q .. 4 q + 3
    top_word = 256 + lane_step + 0 * low_word
    byte_shift = 8 * (2 * h + e)  # weight i = 4 pb + 2 h + e sits in byte i & 3
    pair = 2 * pb + h
    half = e + 0 * r
    return low_word, top_word, byte_shift, pair, half


@triton.jit
def _decode(low_words, top_words, byte_shift, pair, half):
    """Word pairs -> BF16 bits of ``w * 2^(DECODE_BIAS - e0)`` (exponent 0b0111_eoff)."""
    low = (low_words.to(tl.uint32, bitcast=True) >> byte_shift.to(tl.uint32)) & 0xFF
    top = top_words.to(tl.uint32, bitcast=True)
    aligned = tl.where(pair == 0, top, tl.where(pair == 1, top << 4, tl.where(
        pair == 2, top << 8, (top >> 4) | (top << 28))))
    high = (aligned >> (16 * half).to(tl.uint32)) & 0x8700  # sign, eoff[3:1]
    bits = (high | 0x3800 | low).to(tl.int32)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _weight_block(chunks_ptr, tile_base, row_ok, c, low_word, top_word, byte_shift, pair, half):
    """The decoded [ROWS, 64] block of chunk column ``c`` (rows of missing tiles: record 0)."""
    base = chunks_ptr + tile_base + c.to(tl.int64) * CHUNK_WORDS
    low_words = tl.load(base + low_word, mask=row_ok, other=0)
    top_words = tl.load(base + top_word, mask=row_ok, other=0)
    return _decode(low_words, top_words, byte_shift, pair, half)


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
def _chunk_step(acc, c, chunks_ptr, tile_base, row_ok, low_word, top_word, byte_shift, pair,
                half, x_ptr, stride_xm, ms, M, K, ON_GPU: tl.constexpr):
    """acc[ROWS, BLOCK_M] += W[:, 64 c : 64 c + 64] @ x[ms, 64 c : 64 c + 64]^T."""
    w = _weight_block(chunks_ptr, tile_base, row_ok, c, low_word, top_word, byte_shift, pair,
                      half)
    cols = c * 64 + tl.arange(0, 64)
    xt = tl.load(x_ptr + ms[None, :].to(tl.int64) * stride_xm + cols[:, None],
                 mask=(ms[None, :] < M) & (cols[:, None] < K), other=0.0)
    return _mma(w, xt, acc, ON_GPU)


@triton.jit
def _warp_sum(w, nchunks, chunks_ptr, tile_base, row_ok, low_word, top_word, byte_shift, pair,
              half, x_ptr, stride_xm, ms, M, K, KW: tl.constexpr, ROWS: tl.constexpr,
              BLOCK_M: tl.constexpr, CHUNK_ITERS: tl.constexpr, ON_GPU: tl.constexpr):
    """The float32 partial product of chunks ``w, w + KW, w + 2 KW, ...`` (what warp ``w`` of
    the CUDA kernel sums)."""
    acc = tl.zeros((ROWS, BLOCK_M), dtype=tl.float32)
    if ON_GPU:
        for c in range(w, nchunks, KW):
            acc = _chunk_step(acc, c, chunks_ptr, tile_base, row_ok, low_word, top_word,
                              byte_shift, pair, half, x_ptr, stride_xm, ms, M, K, ON_GPU)
    else:
        for i in range(0, CHUNK_ITERS):
            c = w + i * KW
            # surplus steps read a chunk that exists and throw the product away
            step = _chunk_step(acc, tl.minimum(c, nchunks - 1), chunks_ptr, tile_base, row_ok,
                               low_word, top_word, byte_shift, pair, half, x_ptr, stride_xm, ms,
                               M, K, ON_GPU)
            acc = tl.where(c < nchunks, step, acc)
    return acc


@triton.jit
def _escape_step(y, i, start, count, ms, m_ok, x_ptr, stride_xm, esc_col_ptr, esc_delta_ptr):
    """y[n, m] += x[m, col] * delta for escape ``i`` of every row n that has one."""
    has = i < count
    col = tl.load(esc_col_ptr + start + i, mask=has, other=0)
    delta = tl.load(esc_delta_ptr + start + i, mask=has, other=0.0)
    xv = tl.load(x_ptr + ms[None, :].to(tl.int64) * stride_xm + col[:, None],
                 mask=has[:, None] & m_ok, other=0.0)
    # where, not a 0/1 product: an inf or NaN correction must not leak into other rows
    return tl.where(has[:, None], y + xv.to(tl.float32) * delta[:, None], y)


@triton.jit
def _add_escapes(y, rows, ms, M, N, x_ptr, stride_xm, rowptr_ptr, esc_col_ptr, esc_delta_ptr,
                 ESC_ITERS: tl.constexpr, ON_GPU: tl.constexpr):
    """y[n, m] += x[m, col] * delta for every escape of row n, in list order.

    All rows of the block step through their own lists together: step i handles escape i of
    every row that has one.
    """
    row_ok = rows < N
    start = tl.load(rowptr_ptr + rows, mask=row_ok, other=0)
    count = tl.load(rowptr_ptr + rows + 1, mask=row_ok, other=0) - start
    m_ok = ms[None, :] < M
    if ON_GPU:
        for i in range(0, tl.max(count, axis=0)):
            y = _escape_step(y, i, start, count, ms, m_ok, x_ptr, stride_xm, esc_col_ptr,
                             esc_delta_ptr)
    else:
        for i in range(0, ESC_ITERS):
            y = _escape_step(y, i, start, count, ms, m_ok, x_ptr, stride_xm, esc_col_ptr,
                             esc_delta_ptr)
    return y


@triton.jit
def store_output(acc, rows, ms, M, N, x_ptr, stride_xm, scale_ptr, rowptr_ptr, esc_col_ptr,
                 esc_delta_ptr, bias_ptr, out_ptr, stride_om, HAS_BIAS: tl.constexpr,
                 ESC_ITERS: tl.constexpr, ON_GPU: tl.constexpr):
    """The epilogue of every Triton GEMM kernel: ``out[ms, rows]`` = BF16 of ``acc[rows, ms]``
    (float32, in decoded units) times the row scales, plus the escape corrections of each row
    in list order, plus the bias."""
    y = acc * tl.load(scale_ptr + rows, mask=rows < N, other=1.0)[:, None]
    y = _add_escapes(y, rows, ms, M, N, x_ptr, stride_xm, rowptr_ptr, esc_col_ptr,
                     esc_delta_ptr, ESC_ITERS, ON_GPU)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[:, None]
    ptrs = out_ptr + ms[None, :].to(tl.int64) * stride_om + rows[:, None]
    tl.store(ptrs, _to_bf16(y, ON_GPU), mask=(ms[None, :] < M) & (rows[:, None] < N))


@triton.jit(do_not_specialize=["M", "nchunks"])
def w12_gemm_kernel(
    x_ptr, chunks_ptr, scale_ptr, rowptr_ptr, esc_col_ptr, esc_delta_ptr, bias_ptr, out_ptr,
    M, N, K, ntiles, nchunks, stride_xm, stride_om,
    KW: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr, HAS_BIAS: tl.constexpr,
    ON_GPU: tl.constexpr, CHUNK_ITERS: tl.constexpr, ESC_ITERS: tl.constexpr,
):
    """out[M, N] = x[M, K] @ W^T (+ bias), BF16 (module docstring). ``CHUNK_ITERS`` and
    ``ESC_ITERS`` are the interpreter's trip counts (unused on the GPU)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ms = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    tile = rows // 16
    row_ok = (tile < ntiles)[:, None]
    tile_base = (tile.to(tl.int64) * nchunks * CHUNK_WORDS)[:, None]
    low_word, top_word, byte_shift, pair, half = _fragment_offsets(ROWS)

    total = tl.zeros((ROWS, BLOCK_M), dtype=tl.float32)
    for w in range(0, KW):  # a loop, not unrolled: one copy of the chunk loop in the binary
        part = _warp_sum(w, nchunks, chunks_ptr, tile_base, row_ok, low_word, top_word,
                         byte_shift, pair, half, x_ptr, stride_xm, ms, M, K, KW, ROWS, BLOCK_M,
                         CHUNK_ITERS, ON_GPU)
        # part 0 as is, not 0 + part: a -0.0 partial keeps its sign, as in the CUDA kernel
        total = tl.where(w == 0, part, total + part)

    store_output(total, rows, ms, M, N, x_ptr, stride_xm, scale_ptr, rowptr_ptr, esc_col_ptr,
                 esc_delta_ptr, bias_ptr, out_ptr, stride_om, HAS_BIAS, ESC_ITERS, ON_GPU)


@triton.jit
def w12_decode_kernel(chunks_ptr, scale_ptr, out_ptr, N, K, ntiles, nchunks,
                      ROWS: tl.constexpr, ON_GPU: tl.constexpr):
    """out[n, k] = W'[n, k] * 2^(e0 - DECODE_BIAS): the in-window weights as BF16 (exact: the
    scale is a power of two). One program per (``ROWS`` rows, chunk column); escapes come out
    as the value of record 0 and the launcher patches them afterwards."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1)
    tile = rows // 16
    tile_base = (tile.to(tl.int64) * nchunks * CHUNK_WORDS)[:, None]
    low_word, top_word, byte_shift, pair, half = _fragment_offsets(ROWS)
    w = _weight_block(chunks_ptr, tile_base, (tile < ntiles)[:, None], c, low_word, top_word,
                      byte_shift, pair, half)
    y = w.to(tl.float32) * tl.load(scale_ptr + rows, mask=rows < N, other=1.0)[:, None]
    cols = c * 64 + tl.arange(0, 64)
    ptrs = out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :]
    tl.store(ptrs, _to_bf16(y, ON_GPU), mask=(rows[:, None] < N) & (cols[None, :] < K))
