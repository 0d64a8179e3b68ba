"""Load-time repack of a ``W12Tensor`` into the layout the GEMM kernels read.

The on-disk planes (hi bytes, lo nibbles two per byte, ``e0`` per row, escapes in CSR) are
regrouped into three int32 planes of shape ``[Np, Kp / 8]``, one word each per group of 8
consecutive columns of a row. The 12 bits of a record are split the way a BF16 value's two
bytes need them:

* ``planes[0]``, ``planes[1]``: the *low byte* of the decoded BF16 value of columns 0..3 and
  4..7 of the group (``eoff[0] | m[6:0]``, column ``i`` in byte ``i``);
* ``planes[2]``: the other 4 bits of each of the 8 columns (sign and ``eoff[3:1]``), placed so
  that the pairs (0,1), (2,3), (4,5), (6,7) line up with bits 15, 10..8 of both 16-bit halves
  of a word after a shift by 0, 4, 8 and a rotation by 4 (``B_POSITIONS``).

So a kernel turns each word pair into two BF16 values with one byte permute (low bytes plus the
constant exponent bits), one shift and one ``lop3``: 11 integer operations per 8 weights. Still
12 bits a weight. Rows are padded to a multiple of ``ROW_ALIGN`` and columns to ``COL_ALIGN``
with record 0 (a finite value; padded columns meet zeroed activations, padded rows are never
stored), so the kernel's main loop needs no masks.

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
ROW_ALIGN = 128
COL_ALIGN = 256


def _b_positions() -> tuple[tuple[int, int, int, int], ...]:
    """Bit positions of (sign, eoff3, eoff2, eoff1) of column j in the ``planes[2]`` word."""
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

    ``planes``: int32 [3, Np, Kp/8]; ``scale``: float32 [Np] (2^(e0 - DECODE_BIAS));
    ``e0``: uint8 [N]; ``esc_rowptr``: int32 [Np + 1]; ``esc_row``/``esc_col``: int32 [E];
    ``esc_val``: int16 [E] (BF16 bits); ``esc_delta``: float32 [E];
    ``counters``: int32 [Np / 16], arrival tickets of the split-K reduction (zero between
    launches: the last program of a row tile rearms its counter).
    """

    n: int
    k: int
    planes: torch.Tensor
    scale: torch.Tensor
    e0: torch.Tensor
    esc_rowptr: torch.Tensor
    esc_row: torch.Tensor
    esc_col: torch.Tensor
    esc_val: torch.Tensor
    esc_delta: torch.Tensor
    counters: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @property
    def device(self) -> torch.device:
        return self.planes.device

    @property
    def padded_shape(self) -> tuple[int, int]:
        return (int(self.planes.shape[1]), int(self.planes.shape[2]) * 8)

    @property
    def num_escapes(self) -> int:
        return int(self.esc_col.numel())

    @property
    def nbytes(self) -> int:
        """Bytes the kernels hold for this weight (planes, scales, escapes)."""
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


def _repack_rows(hi: torch.Tensor, nib: torch.Tensor) -> torch.Tensor:
    """hi, nib: [rows, Kp] int64 -> int32 [3, rows, Kp/8] (see module docstring)."""
    rows, kp = hi.shape
    low = ((hi >> 3) & 1) << 7 | (hi & 7) << 4 | nib  # the decoded value's low byte
    low = low.view(rows, kp // 8, 8)
    byte_shift = torch.tensor((0, 8, 16, 24), device=hi.device)
    a0 = (low[..., :4] << byte_shift).sum(-1)
    a1 = (low[..., 4:] << byte_shift).sum(-1)
    hi = hi.view(rows, kp // 8, 8)
    b = torch.zeros_like(a0)
    for j, positions in enumerate(B_POSITIONS):
        for bit, pos in zip((7, 6, 5, 4), positions, strict=True):  # sign, eoff3, eoff2, eoff1
            b |= ((hi[..., j] >> bit) & 1) << pos
    return torch.stack((_to_int32(a0), _to_int32(a1), _to_int32(b)))


def _repack_planes(w: W12Tensor, np_: int, kp: int) -> torch.Tensor:
    n, k = w.shape
    planes = torch.zeros(3, np_, kp // 8, dtype=torch.int32, device=w.device)
    step = max(1, (1 << 22) // kp)  # bounded int64 temporaries on large weights
    for a in range(0, n, step):
        b = min(n, a + step)
        hi = torch.zeros(b - a, kp, dtype=torch.int64, device=w.device)
        hi[:, :k] = w.hi[a:b]
        lo = w.lo[a:b].to(torch.int64)
        nib = torch.zeros_like(hi)
        nib[:, :k] = torch.stack((lo & 15, lo >> 4), dim=2).reshape(b - a, -1)[:, :k]
        planes[:, a:b] = _repack_rows(hi, nib)
    return planes


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
    return rowptr, rows, w.esc_col.to(torch.int32), delta


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
    rowptr, rows, cols, delta = _escape_arrays(w, np_)
    return PackedW12(
        n=n,
        k=k,
        planes=_repack_planes(w, np_, kp),
        scale=scale,
        e0=w.e0.clone(),
        esc_rowptr=rowptr,
        esc_row=rows,
        esc_col=cols,
        esc_val=w.esc_val.clone(),
        esc_delta=delta,
        counters=torch.zeros(np_ // 16, dtype=torch.int32, device=w.device),
    )


def unpack_bits(planes: torch.Tensor, e0: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """int32 BF16 bit patterns [n, k] of the in-window records (escapes not yet patched)."""
    _, np_, groups = planes.shape
    p = planes[:, :n].to(torch.int64) & 0xFFFFFFFF
    byte_shift = torch.tensor((0, 8, 16, 24), device=planes.device)
    low = torch.cat(((p[0, ..., None] >> byte_shift) & 255, (p[1, ..., None] >> byte_shift) & 255),
                    -1)
    pos = torch.tensor(B_POSITIONS, device=planes.device)  # [8, 4]
    top = (p[2, ..., None, None] >> pos) & 1  # [n, G, 8, 4]: sign, eoff3, eoff2, eoff1
    eoff = top[..., 1] << 3 | top[..., 2] << 2 | top[..., 3] << 1 | (low >> 7)
    e = e0.to(torch.int64)[:, None, None]
    bits = top[..., 0] << 15 | (e + eoff) << 7 | (low & 0x7F)
    return bits.reshape(n, groups * 8)[:, :k].to(torch.int32)


def decode_packed(
    planes: torch.Tensor,
    e0: torch.Tensor,
    esc_rowptr: torch.Tensor,
    esc_col: torch.Tensor,
    esc_val: torch.Tensor,
    n: int,
    k: int,
) -> torch.Tensor:
    """The exact BF16 weight [n, k] from kernel-layout planes, in plain torch (any device)."""
    bits = unpack_bits(planes, e0, n, k)
    out = (bits - ((bits >> 15) << 16)).to(torch.int16)
    if esc_col.numel():
        counts = (esc_rowptr[1 : n + 1] - esc_rowptr[:n]).long()
        rows = torch.repeat_interleave(torch.arange(n, device=out.device), counts)
        out[rows, esc_col.long()] = esc_val
    return out.view(torch.bfloat16)


def decode_weight(pw: PackedW12) -> torch.Tensor:
    """The exact BF16 weight of a :class:`PackedW12`."""
    return decode_packed(pw.planes, pw.e0, pw.esc_rowptr, pw.esc_col, pw.esc_val, pw.n, pw.k)
