"""The certified choice on the device with fixed shapes: the candidates' 16-row tiles of the
W12 head, at most ``tiles`` of them, recomputed with the whole head's bits
(``gemm.rows.linear_tiles``) and the token rule applied among the candidates. Nothing is read
back to the host, so a CUDA graph can hold it; the caller reads ``needed`` (the tiles the
candidates span) once and runs the exact head where it exceeds ``tiles``."""

from __future__ import annotations

import torch

from w12_kernels.gemm.layout import ROW_ALIGN, PackedW12
from w12_kernels.gemm.rows import linear_tiles


def candidate_tiles(cand: torch.Tensor, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the first ``tiles`` 16-row tiles holding a candidate of any row, ascending, padded
    with tile 0: int64 [tiles]; how many tiles hold one: int64 []) of ``cand`` [R, V]."""
    v = cand.shape[1]
    count = -(-v // ROW_ALIGN)
    flags = torch.zeros(count * ROW_ALIGN, dtype=torch.bool, device=cand.device)
    flags[:v] = cand.any(dim=0)
    flags = flags.view(count, ROW_ALIGN).any(dim=1)
    order = flags.cumsum(0) - 1
    slot = torch.where(flags & (order < tiles), order, tiles)  # ``tiles``: a dropped slot
    chosen = torch.zeros(tiles + 1, dtype=torch.long, device=cand.device)
    chosen.scatter_(0, slot, torch.arange(count, device=cand.device))
    return chosen[:tiles], order[-1] + 1


def certified_picks(h: torch.Tensor, cand: torch.Tensor, packed: PackedW12, tiles: int,
                    escapes: int, *, temperature: float = 0.0,
                    noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(picks [R] int64, needed []): for hidden states ``h`` [R, K] BF16 and their candidates
    ``cand`` [R, V] bool, the first maximal exact logit (or ``logit / temperature + noise``)
    among each row's candidates, from the candidates' tiles (``candidate_tiles``) recomputed
    on the W12 head ``packed``; ``escapes`` >= ``tiles`` x ``rows.tile_escapes(packed)``. The
    picks hold only where ``needed <= tiles``."""
    v = cand.shape[1]
    chosen, needed = candidate_tiles(cand, tiles)
    rows = (chosen[:, None] * ROW_ALIGN + torch.arange(ROW_ALIGN, device=h.device)).view(-1)
    live = (torch.arange(tiles, device=h.device) < needed).repeat_interleave(ROW_ALIGN)
    live &= rows < v
    at = rows.clamp(max=v - 1)
    score = linear_tiles(h, packed, chosen, escapes).float()
    if noise is not None:
        score = score / temperature + noise[:, at]
    score = score.masked_fill(~(cand[:, at] & live), float("-inf"))
    return rows[score.argmax(dim=1)], needed  # live rows ascend: the first maximal entry
