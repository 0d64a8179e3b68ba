"""Triton tensor-core kernel of the W12 GEMM for many activation rows (prefill, large verify
batches): the weight is decoded in registers tile by tile and fed to ``tl.dot``, never written
out as BF16.

One program computes ``out[ms, rows]`` for ``BLOCK_M`` activation rows and ``CN`` 16-row tiles
of the weight (``16 CN`` rows), looping over the 64-column chunks of K with one float32
accumulator. Programs are numbered with the M blocks fastest, so the programs that read the same
weight rows run side by side and share them through L2.

**Decode without gathers.** Each chunk's three word planes are read as whole ``[8, 16]`` word
blocks (lane ``4 g + t`` and step ``j`` of ``layout.py``: word ``16 g + 4 t + j``, contiguous;
the loads of the next chunk column are issued before the current one is decoded). Weight
``i = 4 p + 2 h + e`` of lane ``(g, t)``, step ``j`` is row ``g + 8 h`` and column
``16 t + 4 j + 2 p + e`` of the chunk; each of the four (h, p) pairs of a word triple is decoded
with its own constant shifts, two weights (e = 0, 1) per 32-bit operation, and the pairs are
joined into a block laid out ``[(tile, g, h), (t, j, p, e)]``: its column index is the true
column, its row index a fixed permutation of the true rows (``tile * 16 + g + 8 h``), which only
the epilogue (scales, escapes, bias, store) needs to know. The bits are those of
``kernel._decode`` (the same ``w * 2^(DECODE_BIAS - e0)``).

The dot products sum in whatever order ``tl.dot`` takes, so the bits of a row may depend on M
and the block shape: this kernel is for the rows beyond the batch-invariant small-M path. It is
deterministic: no atomics; with ``splits`` > 1 the K range is cut into that many contiguous
ranges, each program writes its float32 sum to a workspace, and ``w12_splitk_finish_kernel``
adds the ranges in order before the epilogue (more programs for weights with few rows).
Under ``TRITON_INTERPRET=1`` (``ON_GPU = False``) the chunk loop's trip count comes in as the
constant ``CHUNK_ITERS`` and ``tl.dot`` multiplies float32 copies of the BF16 operands (see
``kernel.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from w12_kernels.gemm.kernel import CHUNK_WORDS, _mma, store_output


@triton.jit
def _block_words(chunks_ptr, tile0, c, ntiles, nchunks, CN: tl.constexpr):
    """The three word planes ``[CN, 8, 16]`` of chunk column ``c`` of tiles ``tile0 ..`` (axes:
    tile, g, 4 t + j; missing tiles read as 0): low bytes of weights 0..3, of 4..7, and the
    sign/exponent word."""
    tn = tl.arange(0, CN)[:, None, None]
    tile = tile0 + tn
    base = (chunks_ptr + (tile.to(tl.int64) * nchunks + c) * CHUNK_WORDS
            + 16 * tl.arange(0, 8)[None, :, None] + tl.arange(0, 16)[None, None, :])
    ok = tile < ntiles
    return (tl.load(base, mask=ok, other=0), tl.load(base + 128, mask=ok, other=0),
            tl.load(base + 256, mask=ok, other=0))


@triton.jit
def _pair_bits(low_words, aligned, H: tl.constexpr):
    """BF16 bits of the weights (h = H, e = 0) and (h = H, e = 1) of every word: int16 pairs
    [..., 2] (e last). ``aligned``: the sign/exponent word shifted for this pair."""
    t = low_words.to(tl.uint32, bitcast=True) >> (16 * H)  # bytes 2 H and 2 H + 1 at 0 and 8
    word = (aligned & 0x87008700) | 0x38003800 | (t & 0xFF) | ((t << 8) & 0xFF0000)
    return tl.join(word.to(tl.int16), (word >> 16).to(tl.int16))


@triton.jit
def _decode_words(low0, low1, top, CN: tl.constexpr):
    """The words of ``_block_words`` as the BF16 block ``[16 CN, 64]`` (rows in the order of the
    module docstring). Each of the four (h, p) pairs of a word triple is decoded with its own
    constant shifts, two weights per 32-bit operation (e = 0 in the low half, e = 1 in the high
    half, as ``B_POSITIONS`` places them)."""
    top = top.to(tl.uint32, bitcast=True)
    p0 = tl.join(_pair_bits(low0, top, 0), _pair_bits(low0, top << 4, 1))  # [..., e, h]
    p1 = tl.join(_pair_bits(low1, top << 8, 0), _pair_bits(low1, (top >> 4) | (top << 28), 1))
    bits = tl.join(p0, p1)  # [CN, 8, 16, e, h, p]
    bits = tl.permute(bits, (0, 1, 4, 2, 5, 3))  # [CN, 8, h, 16, p, e]
    return tl.reshape(bits, (16 * CN, 64)).to(tl.bfloat16, bitcast=True)


@triton.jit
def _chunk_loop(acc, c0, c1, trips, chunks_ptr, tile0, ntiles, nchunks, x_ptr, stride_xm, ms, M,
                K, CN: tl.constexpr, ON_GPU: tl.constexpr):
    """acc += the decoded chunk columns c0 .. c1 - 1 times x (``trips`` = c1 - c0 on the GPU;
    under the interpreter a constant upper bound, surplus steps dropped). The words of column
    c + 1 are loaded before column c is decoded and multiplied, so their memory latency overlaps
    that work (Triton pipelines only the loads that feed ``tl.dot`` directly, here the
    activations). ``acc`` is [16 CN, BLOCK_M]: the decoded weights are ``tl.dot``'s first
    operand (as the second, staged through shared memory, it was 3-15% slower on the H200).
    """
    last = tl.maximum(c1 - 1, 0)
    low0, low1, top = _block_words(chunks_ptr, tile0, tl.minimum(c0, last), ntiles, nchunks, CN)
    for i in range(0, trips):
        c = c0 + i
        next0, next1, next_top = _block_words(chunks_ptr, tile0, tl.minimum(c + 1, last),
                                              ntiles, nchunks, CN)
        w = _decode_words(low0, low1, top, CN)
        cols = c * 64 + tl.arange(0, 64)
        xs = tl.load(x_ptr + ms[:, None].to(tl.int64) * stride_xm + cols[None, :],
                     mask=(ms[:, None] < M) & (cols[None, :] < K), other=0.0)  # [BLOCK_M, 64]
        step = _mma(w, tl.trans(xs), acc, ON_GPU)
        if ON_GPU:
            acc = step
        else:
            acc = tl.where(c < c1, step, acc)
        low0, low1, top = next0, next1, next_top
    return acc


@triton.jit(do_not_specialize=["M"])
def w12_gemm_large_kernel(
    x_ptr, chunks_ptr, scale_ptr, rowptr_ptr, esc_col_ptr, esc_delta_ptr, bias_ptr, out_ptr,
    ws_ptr, M, N, K, ntiles, nchunks, splits, stride_xm, stride_om,
    CN: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, ON_GPU: tl.constexpr, CHUNK_ITERS: tl.constexpr,
    ESC_ITERS: tl.constexpr,
):
    """out[M, N] = x[M, K] @ W^T (+ bias), BF16 (module docstring). With ``SPLIT`` the chunk
    columns are cut into ``splits`` contiguous ranges, one per program, and each program writes
    its raw float32 sum to ``ws[split, m, n]`` for ``w12_splitk_finish_kernel``. ``CHUNK_ITERS``
    and ``ESC_ITERS`` are the interpreter's trip counts (unused on the GPU)."""
    m_blocks = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    ms = (pid % m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    if SPLIT:
        split = (pid // m_blocks) % splits
        tile0 = (pid // m_blocks // splits) * CN
        per = tl.cdiv(nchunks, splits)
        c0 = split * per
        c1 = tl.minimum(nchunks, c0 + per)
    else:
        split = 0
        tile0 = (pid // m_blocks) * CN
        c0 = 0
        c1 = nchunks
    v = tl.arange(0, 16 * CN)
    rows = (tile0 + v // 16) * 16 + (v % 16) // 2 + 8 * (v % 2)  # true row of block row v

    acc = tl.zeros((16 * CN, BLOCK_M), dtype=tl.float32)
    if ON_GPU:
        acc = _chunk_loop(acc, c0, c1, tl.maximum(c1 - c0, 0), chunks_ptr, tile0, ntiles,
                          nchunks, x_ptr, stride_xm, ms, M, K, CN, ON_GPU)
    else:
        acc = _chunk_loop(acc, c0, c1, CHUNK_ITERS, chunks_ptr, tile0, ntiles, nchunks, x_ptr,
                          stride_xm, ms, M, K, CN, ON_GPU)

    if SPLIT:
        ws = ws_ptr + (split * M + ms[None, :]).to(tl.int64) * N + rows[:, None]
        tl.store(ws, acc, mask=(ms[None, :] < M) & (rows[:, None] < N))
    else:
        store_output(acc, rows, ms, M, N, x_ptr, stride_xm, scale_ptr, rowptr_ptr, esc_col_ptr,
                     esc_delta_ptr, bias_ptr, out_ptr, stride_om, HAS_BIAS, ESC_ITERS, ON_GPU)


@triton.jit(do_not_specialize=["M"])
def w12_splitk_finish_kernel(
    ws_ptr, x_ptr, scale_ptr, rowptr_ptr, esc_col_ptr, esc_delta_ptr, bias_ptr, out_ptr,
    M, N, splits, stride_xm, stride_om,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, HAS_BIAS: tl.constexpr, ON_GPU: tl.constexpr,
    SPLIT_ITERS: tl.constexpr, ESC_ITERS: tl.constexpr,
):
    """out = (ws[0] + ws[1] + ... in this order) * scale + escapes (+ bias), BF16: the epilogue
    of a split ``w12_gemm_large_kernel``, deterministic (a fixed order, no atomics).
    ``SPLIT_ITERS`` is the interpreter's trip count (unused on the GPU)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = (ms[None, :] < M) & (rows[:, None] < N)
    ws = ws_ptr + ms[None, :].to(tl.int64) * N + rows[:, None]
    y = tl.load(ws, mask=ok, other=0.0)
    plane = M.to(tl.int64) * N
    if ON_GPU:
        for s in range(1, splits):
            y += tl.load(ws + s * plane, mask=ok, other=0.0)
    else:
        for s in range(1, SPLIT_ITERS):
            y += tl.load(ws + s * plane, mask=ok, other=0.0)
    store_output(y, rows, ms, M, N, x_ptr, stride_xm, scale_ptr, rowptr_ptr, esc_col_ptr,
                 esc_delta_ptr, bias_ptr, out_ptr, stride_om, HAS_BIAS, ESC_ITERS, ON_GPU)
