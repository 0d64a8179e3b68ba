"""Launch configurations of the W12 GEMM, chosen from the weight shape alone.

Small M (<= ``SMALL_M_MAX``): one configuration per (N, K) for every M, so the tiles, the split
of K and the MMA shape never depend on M (batch invariance); activation rows go through in
chunks of ``block_m = 16`` inside each program. Split-K is picked so that row tiles times
splits fill the GPU about ``waves`` times over. Large M uses wider activation tiles, or decodes
to BF16 and calls cuBLAS. The block shapes come from ``tuned.json`` next to this file, written
by ``benchmarks/gemm.py --sweep`` on an H200 (docs/PERF_GEMM.md); without it, built-in defaults.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path

SMALL_M_MAX = 64
SMALL_BLOCK_M = 16
TUNED_PATH = Path(__file__).with_name("tuned.json")

_DEFAULT_TABLE = {
    # Weight classes by N * K; the first whose max_weights covers the layer applies. Winners
    # of the H200 sweep of 2026-11-29 (docs/PERF_GEMM.md); large M: decode + cuBLAS beat the
    # fused wide-tile kernel there.
    "small_m": [
        {"max_weights": 40_000_000, "block_n": 32, "block_k": 256, "num_warps": 4,
         "num_stages": 4, "waves": 1.0},
        {"max_weights": None, "block_n": 64, "block_k": 256, "num_warps": 4,
         "num_stages": 3, "waves": 1.0},
    ],
    "large_m": {"mode": "decode"},
}


@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    block_m: int = SMALL_BLOCK_M
    max_chunks: int = SMALL_M_MAX // SMALL_BLOCK_M
    use_asm: bool = True
    esc_chunk: int = 16

    def with_(self, **changes) -> GemmConfig:
        return replace(self, **changes)


@functools.cache
def table() -> dict:
    """The tuned table (``tuned.json``) or the built-in defaults."""
    if TUNED_PATH.exists():
        return json.loads(TUNED_PATH.read_text())
    return _DEFAULT_TABLE


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pick_split(n_tiles: int, k_blocks: int, num_sms: int, waves: float = 2.0,
               min_blocks: int = 4) -> int:
    """Smallest power-of-two split so that tiles * split >= waves * SMs, keeping >= min_blocks
    K blocks per split."""
    split = 1
    while n_tiles * split < waves * num_sms and k_blocks // (split * 2) >= min_blocks:
        split *= 2
    return split


def small_config(n: int, k: int, num_sms: int) -> GemmConfig:
    """The one configuration used for every M <= SMALL_M_MAX on an (N, K) weight."""
    rows = table()["small_m"]
    row = next(r for r in rows if r["max_weights"] is None or n * k <= r["max_weights"])
    split = pick_split(_cdiv(n, row["block_n"]), _cdiv(k, row["block_k"]), num_sms,
                       waves=row["waves"])
    return GemmConfig(block_n=row["block_n"], block_k=row["block_k"], split_k=split,
                      num_warps=row["num_warps"], num_stages=row["num_stages"])


def large_config(n: int, k: int, m: int, num_sms: int) -> GemmConfig | None:
    """Configuration for M > SMALL_M_MAX, or None: decode to BF16 and call cuBLAS."""
    row = table()["large_m"]
    if row["mode"] == "decode":
        return None
    return GemmConfig(block_n=row["block_n"], block_k=row["block_k"], split_k=1,
                      num_warps=row["num_warps"], num_stages=row["num_stages"],
                      block_m=row["block_m"], max_chunks=1, esc_chunk=2)
