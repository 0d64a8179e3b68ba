"""A few output rows of a W12 product with the bits the whole product gives them.

``linear_rows(x, w, ids)`` is ``w12_linear(x, w)[:, ids]`` without reading the other rows'
weights: the 16-row tiles that hold ``ids`` are gathered into a smaller packed weight
(``tile_subset``: its chunks, scales and escape lists), which the small-M kernel runs with the
*whole* weight's K split (``kw``). An output row of the small-M kernels depends only on its own
tile, the activations and ``kw`` (tiles are independent and no schedule parameter changes a
sum), so the gathered rows get the same bits. That holds where the whole product would take the
small-M path: up to ``small_rows_limit()`` rows with the CUDA kernels, ``SMALL_M_MAX`` with the
Triton ones (``rows_reproducible``); elsewhere, and on the CPU (decode + ``F.linear``, whose
summation order is the BLAS library's), ``linear_rows`` refuses. The certified INT8 LM head
recomputes its candidate rows this way.

``linear_tiles(x, w, tiles, escapes)`` is the same product for a fixed number of tiles with a
fixed room for their escapes (``tile_escapes``: the most any tile holds, read once): every
shape is known before the call and nothing is read back to the host, so a CUDA graph can hold
it (a repeated tile is computed twice, harmlessly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from w12.errors import W12Error
from w12_kernels.gemm.layout import ROW_ALIGN, PackedW12
from w12_kernels.gemm.table import SMALL_M_MAX


@dataclass(frozen=True)
class TileSubset:
    """The tensors the small-M kernels read, for the tiles ``tiles`` of a packed weight (rows
    ``16 t .. 16 t + 15`` of tile ``t`` become rows ``16 i ..`` of the subset's tile ``i``)."""

    n: int  # 16 x the number of tiles (padding rows included)
    chunks: torch.Tensor
    scale: torch.Tensor
    esc_rowptr: torch.Tensor
    esc_row: torch.Tensor
    esc_col: torch.Tensor
    esc_delta: torch.Tensor


def tile_subset(w: PackedW12, tiles: torch.Tensor) -> TileSubset:
    """The 16-row tiles ``tiles`` (int64 indices, any order, on the weight's device) of ``w``."""
    count = int(w.chunks.shape[0])
    tiles = tiles.to(device=w.device, dtype=torch.long)
    if tiles.dim() != 1 or (tiles.numel() and (int(tiles.min()) < 0
                                               or int(tiles.max()) >= count)):
        raise W12Error(f"tile_subset: tile indices must be a vector in [0, {count})")
    return _gather(w, tiles)


def _gather(w: PackedW12, tiles: torch.Tensor) -> TileSubset:
    """``tile_subset`` without the check of the indices (``linear_rows`` checked its rows):
    room for exactly the tiles' escapes (one read of their count)."""
    ptr = w.esc_rowptr.long()
    total = int((ptr[(tiles + 1) * ROW_ALIGN] - ptr[tiles * ROW_ALIGN]).sum())
    return _gather_fixed(w, tiles, total)


def tile_escapes(w: PackedW12) -> int:
    """The most escapes any 16-row tile of ``w`` holds (one read of the row pointers)."""
    per_tile = w.esc_rowptr.long()[::ROW_ALIGN]
    return int((per_tile[1:] - per_tile[:-1]).max()) if per_tile.numel() > 1 else 0


def _gather_fixed(w: PackedW12, tiles: torch.Tensor, room: int) -> TileSubset:
    """``_gather`` with ``room`` escape slots whatever the tiles hold (the row pointers bound
    what the kernels read; the slots past the last escape are never read)."""
    rows = (tiles[:, None] * ROW_ALIGN + torch.arange(ROW_ALIGN, device=w.device)).reshape(-1)
    start = w.esc_rowptr.long()[rows]
    per_row = w.esc_rowptr.long()[rows + 1] - start
    rowptr = torch.zeros(rows.numel() + 1, dtype=torch.long, device=w.device)
    rowptr[1:] = per_row.cumsum(0)
    slot = torch.arange(max(room, 1), device=w.device)
    new_row = torch.searchsorted(rowptr[1:], slot, right=True).clamp(max=rows.numel() - 1)
    src = torch.where(slot < rowptr[-1], start[new_row] + slot - rowptr[new_row], 0)
    return TileSubset(n=rows.numel(), chunks=w.chunks[tiles], scale=w.scale[rows],
                      esc_rowptr=rowptr.to(torch.int32), esc_row=new_row.to(torch.int32),
                      esc_col=w.esc_col[src], esc_delta=w.esc_delta[src])


def rows_reproducible(m: int, device: torch.device) -> bool:
    """Whether ``linear_rows`` can give ``m`` activation rows the whole product's bits here."""
    if device.type != "cuda":
        return False
    from w12_kernels.gemm import dispatch

    kind = dispatch.backend()
    if kind == "cuda":
        return m <= dispatch.small_rows_limit()
    return kind == "triton" and m <= SMALL_M_MAX


def linear_rows(x: torch.Tensor, w: PackedW12, ids: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``w12_linear(x, w, bias)[:, ids]`` (BF16 [M, len(ids)], the same bits) from the tiles
    that hold ``ids`` only. Raises ``W12Error`` where the bits cannot be reproduced
    (``rows_reproducible``)."""
    from w12_kernels.gemm import dispatch

    m = x.shape[0]
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] != w.k:
        raise W12Error(f"linear_rows: x must be bfloat16 [M, {w.k}], got {x.dtype} "
                       f"{tuple(x.shape)}")
    if not rows_reproducible(m, x.device):
        path = dispatch.backend() if x.device.type == "cuda" else "decode + F.linear"
        raise W12Error(f"linear_rows: {m} rows on {x.device} ({path}) do not take the small-M "
                       "kernels, whose rows it reproduces")
    ids = ids.to(device=x.device, dtype=torch.long)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= w.n):
        raise W12Error(f"linear_rows: row ids must lie in [0, {w.n})")
    tiles, where = torch.unique(ids // ROW_ALIGN, return_inverse=True)
    out = _tiles_product(x, w, _gather(w, tiles), tiles, bias)
    return out[:, where * ROW_ALIGN + ids % ROW_ALIGN]


def linear_tiles(x: torch.Tensor, w: PackedW12, tiles: torch.Tensor, escapes: int
                 ) -> torch.Tensor:
    """``w12_linear(x, w)`` at the rows of the 16-row tiles ``tiles`` (int64 [T] on the
    weight's device, in range: not checked, nothing is read back), BF16 [M, 16 T] with the
    whole product's bits; ``escapes`` >= T x ``tile_escapes(w)``. Fixed shapes, no host sync
    (the module docstring); raises ``W12Error`` as ``linear_rows`` does."""
    m = x.shape[0]
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] != w.k:
        raise W12Error(f"linear_tiles: x must be bfloat16 [M, {w.k}], got {x.dtype} "
                       f"{tuple(x.shape)}")
    if not rows_reproducible(m, x.device):
        raise W12Error(f"linear_tiles: {m} rows on {x.device} do not take the small-M kernels")
    return _tiles_product(x, w, _gather_fixed(w, tiles, escapes), tiles, None)


def _tiles_product(x, w: PackedW12, sub: TileSubset, tiles, bias) -> torch.Tensor:
    """The small-M kernel over the gathered tiles with the whole weight's K split."""
    from w12_kernels.gemm import dispatch

    sub_bias = None
    if bias is not None:
        padded = torch.zeros(int(w.chunks.shape[0]) * ROW_ALIGN, dtype=bias.dtype,
                             device=bias.device)
        padded[: w.n] = bias
        sub_bias = padded.view(-1, ROW_ALIGN)[tiles].reshape(-1).contiguous()
    cfg = dispatch.small_config(w.n, w.k, x.device)  # the whole weight's K split
    if dispatch.backend() == "cuda":
        out = dispatch._small_passes(x, sub.chunks, sub.scale, sub.esc_rowptr, sub.esc_col,
                                     sub.esc_delta, sub_bias, sub.n, w.k, cfg)
    else:
        from w12_kernels.gemm.triton import launcher as triton_launcher

        out = triton_launcher.gemm(x, sub.chunks, sub.scale, sub.esc_rowptr, sub.esc_row,
                                   sub.esc_col, sub.esc_delta, sub_bias, sub.n, w.k, kw=cfg.kw)
    return out
