"""Launch configuration of the small-M W12 GEMM, chosen from the weight shape (and, for what
does not change the arithmetic, from M).

For every M <= ``SMALL_M_MAX`` a weight uses one K split: ``kw`` warps share each 16-row tile,
each summing a contiguous range of its 64-column chunks, and the block adds the ``kw`` partial
tiles in a fixed order. So how K is split and summed never depends on M (batch invariance).
What may depend on M is only how the work is laid out (which of the three CUDA kernels, warps
per block, row tiles per warp, loads in flight), per class of ``NT = ceil(M / 8)`` in
(1, 2, 4, 8): the kernels sum in the same order and give the same bits. The constants come
from ``tuned.json`` next to this file, written from the H200 sweep of
``benchmarks/gemm.py --sweep`` (docs/PERF_GEMM.md); without it, built-in defaults.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

SMALL_M_MAX = 64
NT_CLASSES = (1, 2, 4, 8)
TUNED_PATH = Path(__file__).with_name("tuned.json")

_DEFAULT_RULE = {
    "warps_per_sm": 16,  # aim: tiles * kw >= warps_per_sm * SMs
    "min_chunks_per_warp": 4,
    "max_kw": 8,
    "by_nt": {cls: {"kernel": "ring", "warps": 8, "rt": 1, "depth": 2}
              for cls in ("1", "2", "4", "8")},
}


@dataclass(frozen=True)
class Layout:
    kernel: str  # "ring", "ring_xpf", "ring_il", "ring_xpf_il", "tma", "cluster" (gemm_small)
    warps: int = 8  # cluster kernel: row tiles (warps) per block
    rt: int = 1  # tma kernel: row tiles per warp
    depth: int = 2  # chunks of loads in flight per warp


@dataclass(frozen=True)
class SmallConfig:
    kw: int
    by_nt: tuple[tuple[int, Layout], ...]  # (NT class, layout), classes ascending

    def layout(self, m: int) -> Layout:
        """The kernel layout for ``m`` activation rows."""
        nt = -(-m // 8)
        for cls, layout in self.by_nt:
            if nt <= cls:
                return layout
        raise ValueError(f"{m} rows is more than the small-M path takes ({SMALL_M_MAX})")


@functools.cache
def rule() -> dict:
    """The tuned rule (``tuned.json``) or the built-in defaults."""
    if TUNED_PATH.exists():
        return {**_DEFAULT_RULE, **json.loads(TUNED_PATH.read_text())["small_m"]}
    return dict(_DEFAULT_RULE)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pick_kw(tiles: int, chunks: int, num_sms: int, *, warps_per_sm: int,
            min_chunks_per_warp: int, max_kw: int) -> int:
    """Smallest power of two ``kw`` with ``tiles * kw >= warps_per_sm * SMs``, keeping at least
    ``min_chunks_per_warp`` chunks per warp and ``kw <= max_kw``."""
    kw = 1
    while (kw * 2 <= max_kw and tiles * kw < warps_per_sm * num_sms
           and chunks // (kw * 2) >= min_chunks_per_warp):
        kw *= 2
    return kw


def small_config(n: int, k: int, num_sms: int, r: dict | None = None) -> SmallConfig:
    """The configuration used for every M <= SMALL_M_MAX on an (N, K) weight: the tuned entry
    of that shape when the sweep measured it, else the rule."""
    r = r or rule()
    shaped = r.get("shapes", {}).get(f"{n}x{k}")
    if shaped is not None:
        r = {**r, **shaped, "by_nt": {**r["by_nt"], **shaped.get("by_nt", {})}}
    if "kw" in r:
        kw = r["kw"]
    else:
        kw = pick_kw(_cdiv(max(n, 1), 16), _cdiv(max(k, 1), 64), num_sms,
                     warps_per_sm=r["warps_per_sm"],
                     min_chunks_per_warp=r["min_chunks_per_warp"], max_kw=r["max_kw"])
    by_nt = tuple((cls, Layout(**r["by_nt"][str(cls)])) for cls in NT_CLASSES)
    if len({lay.kernel.endswith("_il") for _, lay in by_nt}) > 1:
        # interleaved and contiguous K ranges sum in different orders: mixing them would make
        # the bits of a row depend on M
        raise ValueError(f"tuned layouts mix K-range orders: {[lay for _, lay in by_nt]}")
    return SmallConfig(kw=kw, by_nt=by_nt)
