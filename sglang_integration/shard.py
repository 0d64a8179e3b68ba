"""Cut one rank's part out of a W12 checkpoint tensor (plain torch, no SGLang).

A tensor-parallel rank holds a block of rows (column-parallel layers, one block per fused
shard) or a block of columns (row-parallel layers) of each weight. For W12 that block is cut
out of every plane: ``hi`` and ``e0`` by plain slicing; ``lo`` by unpacking the nibbles of the
block and packing them again, because a block that starts at an odd column does not start on
a byte (and an odd-width block leaves half a byte that must read 0); the escape list by keeping
the escapes of the block's rows whose column lies in the block, with columns re-based to the
block's first column. The result is again a valid W12 encoding of exactly the block's BF16
values: records are untouched, each row keeps its base exponent, and every kept escape still
lies outside its row's window.

Escape lists are ragged, so a rank's escapes are collected as pieces (one per fused shard, in
row order) and joined into one CSR list once every shard has arrived (:func:`assemble`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from w12 import spec

COMPONENTS = ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val")
DENSE = ("hi", "lo", "e0")
ESCAPES = ("esc_rowptr", "esc_col", "esc_val")


@dataclass(frozen=True)
class Rows:
    """The rows of one checkpoint tensor that a rank holds, and where they go."""

    local_start: int  # first row in the rank's weight
    ckpt_start: int  # first row taken from the checkpoint tensor
    count: int
    ckpt_total: int  # rows the checkpoint tensor must have


@dataclass(frozen=True)
class Columns:
    """The columns of the checkpoint tensors that a rank holds."""

    ckpt_start: int
    count: int
    ckpt_total: int


@dataclass(frozen=True)
class EscapePiece:
    """The escapes of ``counts.numel()`` consecutive rank rows starting at ``local_start``."""

    local_start: int
    counts: torch.Tensor  # int64 [rows]: escapes per row
    col: torch.Tensor  # int32 [E], rank-local columns
    val: torch.Tensor  # int16 [E], BF16 bits


def expected_shape(component: str, rows: Rows, cols: Columns) -> tuple[int, ...]:
    """Shape the checkpoint tensor of ``component`` must have; -1 marks a ragged length."""
    n, k = rows.ckpt_total, cols.ckpt_total
    shapes = {
        "hi": (n, k),
        "lo": (n, spec.lo_width(k)),
        "e0": (n,),
        "esc_rowptr": (n + 1,),
        "esc_col": (-1,),
        "esc_val": (-1,),
    }
    return shapes[component]


def shape_matches(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    if len(shape) != len(expected):
        return False
    return all(e in (-1, s) for s, e in zip(shape, expected, strict=True))


def slice_dense(component: str, tensor: torch.Tensor, rows: Rows, cols: Columns) -> torch.Tensor:
    """The rank's block of a ``hi``, ``lo`` or ``e0`` checkpoint tensor."""
    block = tensor.narrow(0, rows.ckpt_start, rows.count)
    cut = {"hi": _slice_hi, "lo": _slice_lo, "e0": lambda t, _: t}[component]
    return cut(block, cols)


def _slice_hi(hi: torch.Tensor, cols: Columns) -> torch.Tensor:
    return hi.narrow(1, cols.ckpt_start, cols.count)


def _slice_lo(lo: torch.Tensor, cols: Columns) -> torch.Tensor:
    first = cols.ckpt_start // 2
    stop = (cols.ckpt_start + cols.count + 1) // 2
    packed = lo[:, first:stop]
    nibbles = torch.stack((packed & 15, packed >> 4), dim=2).reshape(lo.shape[0], -1)
    skip = cols.ckpt_start - 2 * first  # 1 when the block starts in a byte's high nibble
    nibbles = nibbles[:, skip : skip + cols.count]
    # an odd-width block pads with a 0 nibble, the canonical filler of the last byte
    nibbles = torch.nn.functional.pad(nibbles, (0, cols.count % 2))
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)


def slice_escapes(rowptr: torch.Tensor, col: torch.Tensor, val: torch.Tensor, rows: Rows,
                  cols: Columns) -> EscapePiece:
    """The escapes of the rank's block, columns re-based to the block's first column."""
    ptr = rowptr.narrow(0, rows.ckpt_start, rows.count + 1).to(torch.int64)
    first, stop = int(ptr[0]), int(ptr[-1])
    columns = col[first:stop].to(torch.int64)
    owner = torch.repeat_interleave(torch.arange(rows.count, device=ptr.device), ptr[1:] - ptr[:-1])
    keep = (columns >= cols.ckpt_start) & (columns < cols.ckpt_start + cols.count)
    return EscapePiece(
        local_start=rows.local_start,
        counts=torch.bincount(owner[keep], minlength=rows.count),
        col=(columns[keep] - cols.ckpt_start).to(torch.int32),
        val=val[first:stop][keep].to(torch.int16),
    )


def zero_rows(local_start: int, count: int, width: int) -> EscapePiece:
    """Rows that decode to +0 everywhere (padding, e.g. of a vocabulary shard).

    Record 0 decodes to the smallest value of the window, not to 0, so every element of such
    a row is an escape holding +0.
    """
    return EscapePiece(
        local_start=local_start,
        counts=torch.full((count,), width, dtype=torch.int64),
        col=torch.arange(width, dtype=torch.int32).repeat(count),
        val=torch.zeros(count * width, dtype=torch.int16),
    )


def assemble(pieces: list[EscapePiece]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Join pieces that tile the rank's rows into one CSR escape list (rowptr, col, val)."""
    ordered = sorted(pieces, key=lambda piece: piece.local_start)
    counts = torch.cat([piece.counts for piece in ordered])
    rowptr = torch.cat((torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)))
    col = torch.cat([piece.col for piece in ordered])
    val = torch.cat([piece.val for piece in ordered])
    return rowptr, col, val
