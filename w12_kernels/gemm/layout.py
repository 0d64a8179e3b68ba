"""Load-time repack of a ``W12Tensor`` into the fragment layout the GEMM kernels read.

The weight ``W[N, K]`` is cut into *chunks* of 16 rows x 64 columns (rows padded to a multiple
of ``ROW_ALIGN`` = 16, columns to ``COL_ALIGN`` = 64, with record 0: a finite value that meets
zeroed activations, or rows that are never stored). A chunk is 1536 bytes: 384 int32 words in
the order ``[plane q (3)][lane (32)][step j (4)]``, so one warp reads it with three fully
coalesced 16-byte loads per lane and holds, with no shuffles, the A operands of four
``mma.m16n8k16`` instructions (one per ``step``), weights on the MMA's M side.

Lane ``l = 4 g + t`` of a chunk starting at row ``r0`` and column ``c0`` holds, for step ``j``,
the 8 weights ``i = 0..7`` at

    row = r0 + g + 8 * ((i >> 1) & 1),   col = c0 + 16 t + 4 j + 2 * (i >> 2) + (i & 1)

i.e. for each of rows ``g`` and ``g + 8`` the four consecutive columns ``16 t + 4 j .. + 3``.
The MMA does not care in which order it sums over K as long as both operands agree, so the
activation operand of lane ``t`` is then the 16 consecutive columns ``16 t .. 16 t + 15`` of the
chunk: two 16-byte loads per activation row.

The 8 weights of (lane, step) are 12 bits each, split over three words the way BF16 needs them:

* ``q = 0``, ``q = 1``: the *low byte* of the decoded value of weights 0..3 and 4..7
  (``eoff[0] | m[6:0]``, weight ``i`` in byte ``i & 3``);
* ``q = 2``: the other 4 bits of each weight (sign and ``eoff[3:1]``), placed so that the pairs
  (0,1), (2,3), (4,5), (6,7) line up with bits 15, 10..8 of both 16-bit halves of a word after
  a shift by 0, 4, 8 and a rotation by 4 (``B_POSITIONS``).

A kernel turns each triple into the four BF16 pairs of an MMA A fragment with one byte permute
(low bytes plus the constant exponent bits), one shift and one ``lop3`` per pair.

Each row decodes with the fixed exponent bias ``DECODE_BIAS`` instead of its own ``e0``: the
decoded value ``w' = w * 2^(DECODE_BIAS - e0)`` has the same bits as ``w`` except the exponent
(whose high nibble is then the constant 0111), and the kernels multiply each output row by
``scale = 2^(e0 - DECODE_BIAS)`` (a power of two, so exact) after the dot product. Escapes are
corrected afterwards with ``y[m, n] += x[m, c] * delta`` where ``delta = v - 2^(e0 - 127)``:
the value record 0 decodes to is taken out and the exact BF16 value ``v`` put in.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from w12.errors import W12Error
from w12.tensor import W12Tensor

DECODE_BIAS = 112  # exponent field 0b0111_eoff: bits 14..11 of every decoded value are 0111
ROW_ALIGN = 16  # rows of a chunk (the MMA's M)
COL_ALIGN = 64  # columns of a chunk (four MMA K steps)
CHUNK_WORDS = 384  # int32 words of one chunk: 3 planes x 32 lanes x 4 steps


def _b_positions() -> tuple[tuple[int, int, int, int], ...]:
    """Bit positions of (sign, eoff3, eoff2, eoff1) of weight i in the ``q = 2`` word."""
    out = []
    for j in range(8):
        pair, half = divmod(j, 2)
        target = (15 + 16 * half, 10 + 16 * half, 9 + 16 * half, 8 + 16 * half)
        shift = (0, -4, -8, 4)[pair]  # undone by: none, << 4, << 8, rotate right 4
        out.append(tuple((t + shift) % 32 for t in target))
    return tuple(out)


B_POSITIONS = _b_positions()


@dataclass(frozen=True)
class PackedW12:
    """A W12 weight in kernel layout; make it once with :func:`prepare_weight`.

    ``chunks``: int32 [Np/16, Kp/64, 384] (module docstring); ``scale``: float32 [Np]
    (2^(e0 - DECODE_BIAS)); ``e0``: uint8 [N]; ``esc_rowptr``: int32 [Np + 1];
    ``esc_row``/``esc_col``: int32 [E]; ``esc_val``: int16 [E] (BF16 bits);
    ``esc_delta``: float32 [E]; ``esc_order``: int32 [E], the escape indices of each 16-row
    tile (the range ``esc_rowptr[16 T] .. esc_rowptr[16 T + 16]``) reordered by 64-column
    chunk (stable), the order in which the large-M kernel writes them into its decoded tiles;
    ``esc_entry``: int32 [E, 2], for each place ``i`` of ``esc_order`` what the large-M kernel
    (its decoded weights in registers) needs of escape ``esc_order[i]``: its chunk column
    (word 0) and, in word 1, bit 31 whether its value divided by the row's scale is a BF16 zero
    or normal number that gives it back (the kernel then writes it into the decoded tile),
    bits 30..16 the register slot that holds it (``escape_slot``) and bits 15..0 that BF16
    value (0 where there is none); ``esc_fix``: int32 [Np], each row's first escape that the
    tiles cannot hold (inf, NaN, out of range: the epilogue corrects it and those after it),
    ``esc_rowptr[row + 1]`` where there is none. Both are computed once here, so that a block
    of the large-M kernel reads them in one step, not by a chain of dependent loads.
    """

    n: int
    k: int
    chunks: torch.Tensor
    scale: torch.Tensor
    e0: torch.Tensor
    esc_rowptr: torch.Tensor
    esc_row: torch.Tensor
    esc_col: torch.Tensor
    esc_val: torch.Tensor
    esc_delta: torch.Tensor
    esc_order: torch.Tensor
    esc_entry: torch.Tensor
    esc_fix: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @property
    def device(self) -> torch.device:
        return self.chunks.device

    @property
    def padded_shape(self) -> tuple[int, int]:
        return (int(self.chunks.shape[0]) * ROW_ALIGN, int(self.chunks.shape[1]) * COL_ALIGN)

    @property
    def num_escapes(self) -> int:
        return int(self.esc_col.numel())

    @property
    def nbytes(self) -> int:
        """Bytes the kernels hold for this weight (chunks, scales, escapes)."""
        return sum(
            t.numel() * t.element_size()
            for f in fields(self)
            if isinstance(t := getattr(self, f.name), torch.Tensor)
        )

    def to(self, device: torch.device | str) -> PackedW12:
        moved = {
            f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
            for f in fields(self)
        }
        return PackedW12(**moved)


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _to_int32(word: torch.Tensor) -> torch.Tensor:
    return (word - ((word >> 31) << 32)).to(torch.int32)


def _pack_groups(hi: torch.Tensor, nib: torch.Tensor) -> torch.Tensor:
    """hi, nib: int64 [..., 8] (one group of 8 weights) -> int32 [..., 3] words q = 0, 1, 2."""
    low = ((hi >> 3) & 1) << 7 | (hi & 7) << 4 | nib  # the decoded value's low byte
    byte_shift = torch.tensor((0, 8, 16, 24), device=hi.device)
    a0 = (low[..., :4] << byte_shift).sum(-1)
    a1 = (low[..., 4:] << byte_shift).sum(-1)
    b = torch.zeros_like(a0)
    for i, positions in enumerate(B_POSITIONS):
        for bit, pos in zip((7, 6, 5, 4), positions, strict=True):  # sign, eoff3, eoff2, eoff1
            b |= ((hi[..., i] >> bit) & 1) << pos
    return torch.stack((_to_int32(a0), _to_int32(a1), _to_int32(b)), dim=-1)


def _chunk_rows(hi: torch.Tensor, nib: torch.Tensor) -> torch.Tensor:
    """hi, nib: int64 [16 * T, Kp] -> int32 [T, Kp/64, 384] (module docstring)."""
    rows, kp = hi.shape
    tiles, chunks = rows // ROW_ALIGN, kp // COL_ALIGN

    def to_fragments(plane: torch.Tensor) -> torch.Tensor:
        # [T, h, g, C, t, j, pb, e] with row = 16T + 8h + g, col = 64C + 16t + 4j + 2pb + e
        p = plane.view(tiles, 2, 8, chunks, 4, 4, 2, 2)
        # -> [T, C, j, g, t, pb, h, e]: lane = 4g + t, weight i = 4pb + 2h + e
        return p.permute(0, 3, 5, 2, 4, 6, 1, 7).reshape(tiles, chunks, 4, 32, 8)

    words = _pack_groups(to_fragments(hi), to_fragments(nib))  # [T, C, j, lane, q]
    return words.permute(0, 1, 4, 3, 2).reshape(tiles, chunks, CHUNK_WORDS).contiguous()


def _repack(w: W12Tensor, np_: int, kp: int) -> torch.Tensor:
    n, k = w.shape
    chunks = torch.zeros(np_ // ROW_ALIGN, kp // COL_ALIGN, CHUNK_WORDS, dtype=torch.int32,
                         device=w.device)
    step = max(ROW_ALIGN, (1 << 21) // kp // ROW_ALIGN * ROW_ALIGN)  # bounded int64 temporaries
    for a in range(0, np_, step):
        b = min(np_, a + step)
        hi = torch.zeros(b - a, kp, dtype=torch.int64, device=w.device)
        nib = torch.zeros_like(hi)
        if a < n:
            stop = min(b, n)
            hi[: stop - a, :k] = w.hi[a:stop]
            lo = w.lo[a:stop].to(torch.int64)
            nibbles = torch.stack((lo & 15, lo >> 4), dim=2).reshape(stop - a, -1)
            nib[: stop - a, :k] = nibbles[:, :k]
        chunks[a // ROW_ALIGN : b // ROW_ALIGN] = _chunk_rows(hi, nib)
    return chunks


def _escape_arrays(w: W12Tensor, np_: int):
    n, _ = w.shape
    rowptr = torch.zeros(np_ + 1, dtype=torch.int32, device=w.device)
    rowptr[: n + 1] = w.esc_rowptr.to(torch.int32)
    rowptr[n + 1 :] = w.num_escapes
    counts = w.esc_rowptr[1:] - w.esc_rowptr[:-1]
    rows = torch.repeat_interleave(torch.arange(n, device=w.device), counts).to(torch.int32)
    value = w.esc_val.view(torch.bfloat16).to(torch.float64)
    record0 = torch.exp2(w.e0.to(torch.float64) - 127.0)[rows.long()]
    delta = (value - record0).to(torch.float32)  # inf and NaN carry through
    cols = w.esc_col.to(torch.int32)
    nchunks = _round_up(max(w.shape[1], 1), COL_ALIGN) // COL_ALIGN
    key = (rows.to(torch.int64) // ROW_ALIGN) * nchunks + cols.to(torch.int64) // COL_ALIGN
    order = torch.argsort(key, stable=True).to(torch.int32)  # rows are sorted: tiles stay put
    return rowptr, rows, cols, delta, order


def patchable(esc_val: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per escape (BF16 bits ``esc_val``; ``k``: log2 of its row's scale, ``e0 - DECODE_BIAS``):
    whether ``v / 2^k`` is a BF16 zero or normal number that gives ``v`` back exactly, and that
    number's bits (int32; 0 where it is not). The kernels decide this in float32 without
    flushing subnormals (``patch_value``); here it is integer arithmetic, so that the answer does
    not depend on the device or on a flush-to-zero mode (torch's float kernels on a GPU can give
    a subnormal escape another answer than the kernel)."""
    v = esc_val.to(torch.int64) & 0xFFFF
    sign, e, m = v & 0x8000, (v >> 7) & 0xFF, v & 0x7F
    top = torch.tensor([-1] + [i.bit_length() - 1 for i in range(1, 128)], device=v.device)
    p = top[m]  # a subnormal's leading bit: its value is 2^(p - 133) x 1.f
    exp = torch.where(e > 0, e, p - 6)  # the biased exponent of the value, normalised
    mant = torch.where(e > 0, m, (m << (7 - p).clamp(min=0)) & 0x7F)
    new = exp - k.to(torch.int64)
    zero = (e == 0) & (m == 0)
    ok = zero | ((e < 255) & (new >= 1) & (new <= 254))
    bits = torch.where(zero, sign, sign | (new.clamp(0, 255) << 7) | mant)
    return ok, torch.where(ok, bits, 0).to(torch.int32)


def escape_slot(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """Where the escape at (row, col) sits in the A-fragment registers of the warp that
    decodes its 16-row tile: 256 x the lane that holds it, plus 2 x its register 4 j + r, plus
    which half of that register (layout at the top of this module)."""
    cc = col & 63
    lane = 4 * (row & 7) + (cc >> 4)
    reg = 4 * ((cc & 15) >> 2) + ((row >> 3) & 1) + 2 * ((cc >> 1) & 1)
    return (lane << 8) | (reg << 1) | (cc & 1)


def _escape_entries(e0, esc_val, rowptr, rows, cols, order, np_):
    """``esc_entry`` and ``esc_fix`` (PackedW12) of the escapes (rows, cols, esc_val) in list
    order, ``order`` their tile-chunk order; ``e0`` the rows' window bases (int32)."""
    ok, bits = patchable(esc_val, e0[rows.long()] - DECODE_BIAS)
    word1 = (ok.to(torch.int64) << 31) | (escape_slot(rows, cols).to(torch.int64) << 16) | bits
    entry = torch.stack((cols >> 6, _to_int32(word1)), dim=1)[order.long()].contiguous()
    fix = rowptr[1:].clone()
    bad = (~ok).nonzero().flatten()
    if bad.numel():
        fix.scatter_reduce_(0, rows[bad].long(), bad.to(torch.int32), "amin")
    return entry.to(torch.int32), fix[:np_].contiguous()


def prepare_weight(w: W12Tensor, *, device: torch.device | str | None = None) -> PackedW12:
    """Repack a ``W12Tensor`` for :func:`w12_linear` (once, at load time).

    ``device`` moves the result (default: the device of ``w``). Raises ``W12Error`` for a
    malformed tensor.
    """
    if not isinstance(w, W12Tensor):
        raise W12Error(f"prepare_weight expects a W12Tensor, got {type(w).__name__}")
    w.validate("weight")
    if device is not None:
        w = w.to(device)
    n, k = w.shape
    np_, kp = _round_up(max(n, 1), ROW_ALIGN), _round_up(max(k, 1), COL_ALIGN)
    e0 = w.e0.to(torch.int32)
    scale = torch.ones(np_, dtype=torch.float32, device=w.device)
    scale[:n] = torch.exp2((e0 - DECODE_BIAS).to(torch.float32))
    rowptr, rows, cols, delta, order = _escape_arrays(w, np_)
    entry, fix = _escape_entries(e0, w.esc_val, rowptr, rows, cols, order, np_)
    return PackedW12(
        n=n,
        k=k,
        chunks=_repack(w, np_, kp),
        scale=scale,
        e0=w.e0.clone(),
        esc_rowptr=rowptr,
        esc_row=rows,
        esc_col=cols,
        esc_val=w.esc_val.clone(),
        esc_delta=delta,
        esc_order=order,
        esc_entry=entry,
        esc_fix=fix,
    )


def unpack_bits(chunks: torch.Tensor, e0: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """int32 BF16 bit patterns [n, k] of the in-window records (escapes not yet patched)."""
    tiles, nchunks, _ = chunks.shape
    words = chunks.to(torch.int64).view(tiles, nchunks, 3, 32, 4) & 0xFFFFFFFF
    words = words.permute(0, 1, 4, 3, 2)  # [T, C, j, lane, q]
    byte_shift = torch.tensor((0, 8, 16, 24), device=chunks.device)
    low = torch.cat(((words[..., 0, None] >> byte_shift) & 255,
                     (words[..., 1, None] >> byte_shift) & 255), -1)  # [T, C, j, lane, 8]
    pos = torch.tensor(B_POSITIONS, device=chunks.device)  # [8, 4]
    top = (words[..., 2, None, None] >> pos) & 1  # [T, C, j, lane, 8, 4]
    eoff = top[..., 1] << 3 | top[..., 2] << 2 | top[..., 3] << 1 | (low >> 7)
    sign = top[..., 0]
    # back to [T, h, g, C, t, j, pb, e] (the inverse of _chunk_rows' permutation)
    def to_matrix(v: torch.Tensor) -> torch.Tensor:
        v = v.view(tiles, nchunks, 4, 8, 4, 2, 2, 2)  # [T, C, j, g, t, pb, h, e]
        v = v.permute(0, 6, 3, 1, 4, 2, 5, 7)
        return v.reshape(tiles * ROW_ALIGN, nchunks * COL_ALIGN)[:n, :k]

    e = e0.to(torch.int64)[:, None]
    bits = to_matrix(sign) << 15 | (e + to_matrix(eoff)) << 7 | (to_matrix(low) & 0x7F)
    return bits.to(torch.int32)


def decode_packed(
    chunks: torch.Tensor,
    e0: torch.Tensor,
    esc_rowptr: torch.Tensor,
    esc_col: torch.Tensor,
    esc_val: torch.Tensor,
    n: int,
    k: int,
) -> torch.Tensor:
    """The exact BF16 weight [n, k] from kernel-layout chunks, in plain torch (any device)."""
    bits = unpack_bits(chunks, e0, n, k)
    out = (bits - ((bits >> 15) << 16)).to(torch.int16)
    if esc_col.numel():
        counts = (esc_rowptr[1 : n + 1] - esc_rowptr[:n]).long()
        rows = torch.repeat_interleave(torch.arange(n, device=out.device), counts)
        out[rows, esc_col.long()] = esc_val
    return out.view(torch.bfloat16)


def decode_weight(pw: PackedW12) -> torch.Tensor:
    """The exact BF16 weight of a :class:`PackedW12`."""
    return decode_packed(pw.chunks, pw.e0, pw.esc_rowptr, pw.esc_col, pw.esc_val, pw.n, pw.k)
