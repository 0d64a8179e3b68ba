"""NumPy emulator of the CUDA kernels ``w12_gemm_small<NT, P, TL, MINB, XS, TG, WB, WS>``
(``w12_kernels/gemm/small/kernels.cu``) and ``w12_decode`` (``gemm/decode/kernels.cu``), lane
by lane, so that the CPU can check the
chunk layout, the fragment mapping and the decode bit tricks that only a GPU runs. It emulates
one tile per block with activations in registers (``TL = TG = 1``, ``XS = 0``; ``MINB`` and
``WB`` only cap registers): the other schedules change no sum, which a GPU test checks bit for
bit.

Written from the kernel source and the PTX ISA, not from ``layout.py``:

* the loads: three ``Words4`` per lane and chunk at ``chunks + (tile * C + c) * 96 + lane
  (+ 32, + 64)`` in units of 16 bytes, through the kernel's ring of ``P`` chunks in flight;
  activations as two 16-byte loads of 8 BF16 at column ``64 c + 16 t`` of row ``8 nt + g``;
* ``decode8`` with ``prmt`` (default mode), shifts, ``shf.r.wrap`` and ``lop3`` on uint32;
* ``mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32`` with the fragment rules of the PTX ISA
  (``groupID = lane >> 2``, ``threadID_in_group = lane % 4``; ``_A_ROW`` and friends).
  The 16 products and the accumulator are summed in float64 and rounded once to float32: the
  tensor core's own internal rounding is not specified by the ISA, so the emulator's bits can
  differ from the GPU's in the last place;
* warp ``w`` of ``kw`` taking chunks ``w, w + kw, w + 2 kw, ...``, the partial tiles summed
  in warp order in float32, the epilogue (scale, escapes in list order as a fused
  multiply-add, approximated by one float64 operation rounded to float32, bias,
  ``cvt.rn.bf16.f32``).
"""

from __future__ import annotations

import numpy as np
import torch

U32 = np.uint32
LANES = np.arange(32)
GROUP, THREAD = LANES >> 2, LANES & 3  # groupID, threadID_in_group


# --------------------------------------------------------------------------- PTX integer ops

def prmt(a: np.ndarray, b: np.ndarray | int, selector: int) -> np.ndarray:
    """``prmt.b32 d, a, b, selector`` (default mode): byte ``i`` of d is byte ``sel_i & 7`` of
    the 8 bytes {b, a} (a = bytes 0..3), or its sign bit replicated when ``sel_i & 8``."""
    source = (np.asarray(b, np.uint64) << np.uint64(32)) | np.asarray(a, np.uint64)
    out = np.zeros(np.broadcast(source).shape, np.uint64)
    for i in range(4):
        sel = (selector >> (4 * i)) & 0xF
        byte = (source >> np.uint64(8 * (sel & 7))) & np.uint64(0xFF)
        if sel & 8:
            byte = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        out |= byte << np.uint64(8 * i)
    return out.astype(U32)


def shf_r_wrap(lo: np.ndarray, hi: np.ndarray, n: int) -> np.ndarray:
    """``shf.r.wrap.b32 d, lo, hi, n``: the low 32 bits of ``{hi, lo} >> (n & 31)``."""
    wide = (np.asarray(hi, np.uint64) << np.uint64(32)) | np.asarray(lo, np.uint64)
    return ((wide >> np.uint64(n & 31)) & np.uint64(0xFFFFFFFF)).astype(U32)


def lop3(a: np.ndarray, b: np.ndarray | int, c: np.ndarray, lut: int) -> np.ndarray:
    """``lop3.b32 d, a, b, c, lut``: bit ``4 a + 2 b + c`` of ``lut`` for every bit position
    (so that ``lut = F(0xF0, 0xCC, 0xAA)``)."""
    a, b, c = (np.asarray(v, np.uint64) & np.uint64(0xFFFFFFFF) for v in (a, b, c))
    ones = np.uint64(0xFFFFFFFF)
    out = np.zeros(np.broadcast(a, b, c).shape, np.uint64)
    for idx in range(8):
        if lut >> idx & 1:
            term = (a if idx & 4 else a ^ ones) & (b if idx & 2 else b ^ ones)
            out |= term & (c if idx & 1 else c ^ ones)
    return out.astype(U32)


def decode8(lo_a: np.ndarray, lo_b: np.ndarray, top: np.ndarray) -> list[np.ndarray]:
    """common.cuh ``decode8``: three words -> the four BF16-pair registers of an A fragment."""
    p0 = prmt(lo_a, 0x38383838, 0x4140)
    p1 = prmt(lo_a, 0x38383838, 0x4342)
    p2 = prmt(lo_b, 0x38383838, 0x4140)
    p3 = prmt(lo_b, 0x38383838, 0x4342)
    t1 = (top.astype(np.uint64) << np.uint64(4)).astype(U32)  # shl.b32 drops the carry
    t2 = (top.astype(np.uint64) << np.uint64(8)).astype(U32)
    t3 = shf_r_wrap(top, top, 4)
    return [lop3(s, 0x87008700, p, 0xEA) for s, p in ((top, p0), (t1, p1), (t2, p2), (t3, p3))]


# --------------------------------------------------------------------------- BF16 helpers

def bf16_pair_to_f32(reg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 32-bit register of two BF16 -> (low element, high element) as float32."""
    reg = np.asarray(reg, U32)
    return (reg << U32(16)).view(np.float32), (reg & U32(0xFFFF0000)).view(np.float32)


def f32_to_bf16_bits(v: np.ndarray) -> np.ndarray:
    """``cvt.rn.bf16.f32``: round to nearest even; NaN stays NaN."""
    bits = np.asarray(v, np.float32).view(U32).astype(np.uint64)
    rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    nan = np.isnan(v)
    rounded = np.where(nan, (bits >> np.uint64(16)) | np.uint64(0x40), rounded)
    return rounded.astype(np.uint16)


# --------------------------------------------------------------------------- the MMA

# PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", .bf16:
# element i of a lane's A fragment (a0..a7; register i // 2, low half first):
#   row = groupID for i in {0, 1, 4, 5}, groupID + 8 otherwise;
#   col = threadID_in_group * 2 + (i & 1), + 8 for i >= 4.
# B (b0..b3): row (k) = threadID_in_group * 2 + (i & 1), + 8 for i >= 2; col (n) = groupID.
# C/D (c0..c3): row = groupID, + 8 for i >= 2; col = threadID_in_group * 2 + (i & 1).
_I8, _I4 = np.arange(8)[None, :], np.arange(4)[None, :]
_A_ROW = GROUP[:, None] + 8 * ((_I8 >> 1) & 1)
_A_COL = 2 * THREAD[:, None] + (_I8 & 1) + 8 * (_I8 >= 4)
_B_ROW = 2 * THREAD[:, None] + (_I4 & 1) + 8 * (_I4 >= 2)
_B_COL = GROUP[:, None] + 0 * _I4
_C_ROW = GROUP[:, None] + 8 * (_I4 >= 2)
_C_COL = 2 * THREAD[:, None] + (_I4 & 1)


def _elements(regs: np.ndarray) -> np.ndarray:
    """[..., 32, R] registers of BF16 pairs -> [..., 32, 2 R] float64 elements, low half first."""
    lo, hi = bf16_pair_to_f32(regs)
    return np.stack((lo, hi), axis=-1).reshape(*regs.shape[:-1], -1).astype(np.float64)


def mma_m16n8k16(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One warp-wide MMA per leading index: ``c`` float32 [..., 32, 4], ``a`` uint32
    [..., 32, 4], ``b`` uint32 [..., 32, 2] -> D float32 [..., 32, 4]."""
    lead = a.shape[:-2]
    a_mat = np.zeros((*lead, 16, 16))
    b_mat = np.zeros((*lead, 16, 8))
    c_mat = np.zeros((*lead, 16, 8))
    a_mat[..., _A_ROW, _A_COL] = _elements(a)
    b_mat[..., _B_ROW, _B_COL] = _elements(b)
    c_mat[..., _C_ROW, _C_COL] = c
    d = (a_mat @ b_mat + c_mat).astype(np.float32)
    return d[..., _C_ROW, _C_COL]


# --------------------------------------------------------------------------- w12_gemm_small

def _as_words(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().cpu().numpy().view(U32)


def _x_words(x: torch.Tensor, kp: int) -> np.ndarray:
    """x as uint32 [M, Kp/2] (two BF16 per word, the lower column in the low half), zeros past
    K: the launcher's padded copy."""
    m, k = x.shape
    padded = np.zeros((m, kp), np.uint16)
    padded[:, :k] = x.cpu().view(torch.int16).numpy().view(np.uint16)
    return padded.view(U32)


def _load_x(xw: np.ndarray, m: int, nt: int, cc: int) -> np.ndarray:
    """The 8 registers ``xv[nt][0..7]`` of every lane: uint32 [32, 8] (rows past M re-read row
    M - 1, as the kernel does: their sums are never stored)."""
    tok = np.minimum(8 * nt + GROUP, m - 1)
    first = (cc * 64 + 16 * THREAD) // 2  # word index of column 64 cc + 16 t
    return xw[tok[:, None], first[:, None] + np.arange(8)[None, :]]


def _warp_partials(words: np.ndarray, xw: np.ndarray, m: int, nt_count: int, kw: int,
                   depth: int) -> np.ndarray:
    """Each warp's accumulators after its chunks: float32 [kw, T, NT, 32, 4]."""
    tiles, nchunks = words.shape[:2]
    acc = np.zeros((kw, tiles, nt_count, 32, 4), np.float32)
    for warp in range(kw):
        first, step = warp, kw  # the warp's chunks: first + i * step for i < n
        n = (nchunks - warp + kw - 1) // kw
        ring = [words[:, first + s * step] if s < n else None for s in range(depth)]
        for i in range(0, n, depth):
            for s in range(depth):
                ii = i + s
                if ii >= n:
                    continue
                w0, w1, w2 = ring[s][:, 0], ring[s][:, 1], ring[s][:, 2]  # [T, 32, 4]
                if ii + depth < n:
                    ring[s] = words[:, first + (ii + depth) * step]
                cur = _load_x_tiles(xw, m, nt_count, first + ii * step)
                _chunk_mma(acc[warp], w0, w1, w2, cur)
    return acc


def _load_x_tiles(xw: np.ndarray, m: int, nt_count: int, chunk: int) -> list[np.ndarray]:
    return [_load_x(xw, m, nt, chunk) for nt in range(nt_count)]


def _chunk_mma(acc: np.ndarray, w0, w1, w2, xv: list[np.ndarray]) -> None:
    """small/kernels.cu ``chunk_mma``: four K steps, each one decode8 and NT MMAs (in place)."""
    tiles = acc.shape[0]
    for j in range(4):
        a = np.stack(decode8(w0[..., j], w1[..., j], w2[..., j]), axis=-1)
        for nt, x_regs in enumerate(xv):
            b = np.broadcast_to(x_regs[:, 2 * j : 2 * j + 2], (tiles, 32, 2))
            acc[:, nt] = mma_m16n8k16(acc[:, nt], a, b)


def _epilogue(acc: np.ndarray, x: torch.Tensor, scale: np.ndarray, rowptr: np.ndarray,
              esc_col: np.ndarray, esc_delta: np.ndarray, bias: np.ndarray | None,
              n: int) -> np.ndarray:
    """Block sum in warp order, scale, escapes in list order, bias, round: BF16 bits [M, N]."""
    m = x.shape[0]
    kw, tiles, nt_count = acc.shape[:3]
    v = acc[0].copy()
    for warp in range(1, kw):
        v = v + acc[warp]  # float32, fixed order
    tile, nt, lane, r = np.meshgrid(np.arange(tiles), np.arange(nt_count), LANES, np.arange(4),
                                    indexing="ij")
    row = tile * 16 + (lane >> 2) + 8 * (r >> 1)
    tok = nt * 8 + 2 * (lane & 3) + (r & 1)
    keep = (row < n) & (tok < m)
    row, tok, v = row[keep], tok[keep], v[keep]
    out = v * scale[row]
    xf = x.float().numpy()
    for i in range(int(np.max(rowptr[1 : n + 1] - rowptr[:n], initial=0))):
        e = rowptr[row] + i
        has = e < rowptr[row + 1]
        ee = np.where(has, e, 0)
        with np.errstate(invalid="ignore", over="ignore"):  # inf and NaN escapes carry through
            fma = out.astype(np.float64) + xf[tok, esc_col[ee]].astype(np.float64) * esc_delta[ee]
            out = np.where(has, fma.astype(np.float32), out)
    if bias is not None:
        out = out + bias[row]
    y = np.zeros((m, n), np.uint16)
    y[tok, row] = f32_to_bf16_bits(out.astype(np.float32))
    return y


def gemm_small(x: torch.Tensor, pw, bias: torch.Tensor | None = None, *, kw: int,
               depth: int = 2) -> torch.Tensor:
    """What ``w12_gemm_small<ceil(M/8), depth, 1, 1, 0, 1, 8, 0>`` with ``kw`` warps
    writes for BF16 ``x [M, K]`` (M <= 64) and a ``PackedW12`` ``pw``: BF16 [M, N]."""
    m = x.shape[0]
    if not 1 <= m <= 64:
        raise ValueError(f"w12_gemm_small takes 1..64 rows, got {m}")
    tiles, nchunks = int(pw.chunks.shape[0]), int(pw.chunks.shape[1])
    words = _as_words(pw.chunks).reshape(tiles, nchunks, 96, 4)  # Words4 units
    # lane l reads Words4 number l, l + 32 and l + 64 of the chunk
    words = np.stack([words[:, :, q * 32 : q * 32 + 32] for q in range(3)], axis=2)
    nt_count = -(-m // 8)
    acc = _warp_partials(words, _x_words(x, nchunks * 64), m, nt_count, kw, depth)
    bias_f = None if bias is None else bias.float().numpy()
    y = _epilogue(acc, x, pw.scale.numpy(), pw.esc_rowptr.numpy().astype(np.int64),
                  pw.esc_col.numpy().astype(np.int64), pw.esc_delta.numpy(), bias_f, pw.n)
    return torch.from_numpy(y.view(np.int16)).view(torch.bfloat16)


# --------------------------------------------------------------------------- w12_decode

def _scale_pair(pair: np.ndarray, s: np.ndarray) -> np.ndarray:
    """decode/kernels.cu ``scale_pair``: both BF16 halves times ``s``, ``cvt.rn.bf16x2.f32``."""
    lo, hi = bf16_pair_to_f32(pair)
    lo_bits = f32_to_bf16_bits(lo * s).astype(U32)
    hi_bits = f32_to_bf16_bits(hi * s).astype(U32)
    return (hi_bits << U32(16)) | lo_bits


def decode(pw) -> torch.Tensor:
    """What ``w12_decode`` writes, then the escapes written in (``decode.launcher.decode``):
    BF16 [N, K]."""
    n, k = pw.n, pw.k
    tiles, nchunks = int(pw.chunks.shape[0]), int(pw.chunks.shape[1])
    words = _as_words(pw.chunks).reshape(tiles, nchunks, 96, 4)
    w0, w1, w2 = (words[:, :, q * 32 : q * 32 + 32] for q in range(3))  # [T, C, 32, 4]
    regs = [decode8(w0[..., j], w1[..., j], w2[..., j]) for j in range(4)]  # [j][reg] [T,C,32]
    scale = pw.scale.numpy()  # [Np]: every row of every tile
    out = np.zeros((tiles * 16, nchunks * 64), np.uint16)
    for half in range(2):
        row = np.arange(tiles)[:, None, None] * 16 + GROUP[None, None, :] + 8 * half
        s = scale[row]
        col = np.arange(nchunks)[None, :, None] * 64 + 16 * THREAD[None, None, :]
        for j in range(4):
            for v_index, reg in ((2 * j, regs[j][half]), (2 * j + 1, regs[j][2 + half])):
                pair = _scale_pair(reg, s)
                rr, cc = np.broadcast_arrays(row, col + 2 * v_index)
                out[rr, cc] = pair & U32(0xFFFF)
                out[rr, cc + 1] = pair >> U32(16)
    out = out[:n, :k].copy()
    out[pw.esc_row.numpy(), pw.esc_col.numpy()] = pw.esc_val.numpy().view(np.uint16)
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
