"""Launch configuration of the small-M W12 GEMM, chosen from the weight shape (and, for what
does not change the arithmetic, from M).

For every M <= ``SMALL_M_MAX`` a weight uses one K split: ``kw`` warps share each 16-row tile,
warp ``w`` summing its chunks ``w, w + kw, ...``, and the block adds the ``kw`` partial tiles
in a fixed order. So how K is split and summed never depends on M (batch invariance).
What may depend on M is only how the work is scheduled (chunk columns in flight, activations
prefetched into registers or staged in shared memory, 16-row tiles per block, a register cap
for occupancy, or the warpgroup-MMA kernel with the same split), per class of
``NT = ceil(M / 8)`` in (1, 2, 4, 8): that changes no sum. 65..128 rows run as two passes of
at most 64, or, where a shape's entry names a ``one_pass`` schedule, as one pass of the
warpgroup-MMA kernel with the same split (the same bits). The
constants come from ``tuned.json`` next to this file, written from the H200 sweep of
``benchmarks/gemm.py --sweep`` (docs/PERF_GEMM.md): a ``kw`` and layouts per measured weight
shape, a rule for other shapes; without the file, built-in defaults.

Beyond the small-M path (``large_config``), the table's ``large`` entry picks per weight shape
and class of M (the smallest listed M class >= M) between the fused tensor-core kernels
(Triton ``kernel_large.py`` or the warpgroup-MMA ``kernels_large.cu``, with their block
shapes) and decode + cuBLAS, from the sweep
``benchmarks/gemm.py --sweep-large``; above the largest M it measured, decode + cuBLAS.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path

SMALL_M_MAX = 64
NT_CLASSES = (1, 2, 4, 8)
TUNED_PATH = Path(__file__).with_name("tuned.json")

DEFAULT_RULE = {
    "warps_per_sm": 16,  # aim: tiles * kw >= warps_per_sm * SMs
    "min_chunks_per_warp": 4,
    "max_kw": 8,
    "by_nt": {cls: {"depth": 2, "prefetch": False} for cls in ("1", "2", "4", "8")},
}


@dataclass(frozen=True)
class Layout:
    depth: int = 2  # chunk columns of loads in flight per warp
    prefetch: bool = False  # activations of the next column loaded ahead
    tiles: int = 1  # 16-row tiles per block (each activation load serves all of them)
    min_blocks: int = 1  # blocks per multiprocessor the registers must allow (blocks of 8
    # warps, or of kw x groups warps where that is more)
    x_stages: int = 0  # activations through this many shared-memory stages (0: registers)
    groups: int = 1  # groups of kw warps per block, each on its own tiles (sharing L1)
    w_stages: int = 0  # weights through this many shared-memory stages (0: register ring)
    cluster: int = 1  # blocks of a thread-block cluster sharing each tile group's kw warps
    # (kw / cluster warps a block; min_blocks then counts blocks of the bound over cluster)
    # The warpgroup-MMA kernel instead of the mma.sync one (same kw, so the same bits; on a
    # GPU without it, the mma.sync kernel): (stages, warpgroups, row groups, split) of
    # wgmma.gemm_wg, or None
    wg: tuple[int, int, int, int] | None = None

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        wg = d.get("wg")
        return cls(**{**d, "wg": tuple(int(v) for v in wg) if wg else None})


@dataclass(frozen=True)
class SmallConfig:
    kw: int
    by_nt: tuple[tuple[int, Layout], ...]  # (NT class, layout), classes ascending
    # 65..128 rows in one pass of the warpgroup-MMA kernel with 128-row blocks (the bits of
    # two 64-row passes, over the weight once): (stages, warpgroups, row groups, split) of
    # wgmma.gemm_wg, or None (two passes; also on a GPU without that kernel)
    one_pass: tuple[int, int, int, int] | None = None

    def layout(self, m: int) -> Layout:
        """The kernel layout for ``m`` activation rows (a clustered layout of the rule's
        defaults on a shape whose kw the cluster does not divide runs unclustered, with the
        same register cap)."""
        nt = -(-m // 8)
        for cls, layout in self.by_nt:
            if nt <= cls:
                if self.kw % layout.cluster:
                    return replace(layout, cluster=1,
                                   min_blocks=max(1, layout.min_blocks // layout.cluster))
                return layout
        raise ValueError(f"{m} rows is more than the small-M path takes ({SMALL_M_MAX})")


@functools.cache
def rule() -> dict:
    """The tuned rule (``tuned.json``) or the built-in defaults."""
    if TUNED_PATH.exists():
        return {**DEFAULT_RULE, **json.loads(TUNED_PATH.read_text())["small_m"]}
    return dict(DEFAULT_RULE)


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
    by_nt = tuple((cls, Layout.from_dict(r["by_nt"][str(cls)])) for cls in NT_CLASSES)
    one_pass = shaped.get("one_pass") if shaped is not None else None
    return SmallConfig(kw=kw, by_nt=by_nt,
                       one_pass=tuple(int(v) for v in one_pass) if one_pass else None)


LARGE_KINDS = ("fused", "wgmma", "decode")
DEFAULT_LARGE = {"kind": "fused", "tiles": 8, "block_m": 128, "num_warps": 8, "num_stages": 3}
DEFAULT_LARGE_MAX_M = 256  # rows up to which the default fused entry applies (the sweep's M)


@dataclass(frozen=True)
class LargeConfig:
    kind: str = "fused"  # "fused": kernel_large.py; "wgmma": kernels_large.cu (Hopper);
    # "decode": decode to BF16, then cuBLAS
    tiles: int = 8  # 16-row weight tiles per program (wgmma: 4 per warpgroup)
    block_m: int = 128  # activation rows per program
    num_warps: int = 8
    num_stages: int = 3  # (wgmma: activation stages)
    w_stages: int = 6  # wgmma: chunk-word stages
    maxnreg: int = 0  # register cap per thread (0: the compiler's choice)
    splits: int = 1  # K ranges (fused: through a workspace, the launcher may lower it;
    # wgmma: the blocks of a cluster)
    a_regs: int = 0  # wgmma: 1 (or true): the decoded weights as the MMA's register operand;
    # 2: that, with a producer warpgroup giving its registers to the MMA warpgroups; 3: that,
    # with tiles 4: two MMA warpgroups on the 64 rows, every other column each
    persist: int = 0  # wgmma with a_regs 2 and one K range: stream-K, one block a
    # multiprocessor, each a share of all (unit, column) steps (cuda_large.stream_k_cuts),
    # outputs from the accumulators (docs/PERF_GEMM.md #60; never inherited from the default:
    # see below)
    tail: int = 0  # wgmma with one K range, not persistent: the tile blocks past the last
    # whole wave run in a second launch with K in this many ranges (1: as stream-K;
    # docs/PERF_GEMM.md #64; never inherited from the default either)
    mcast: int = 0  # wgmma with a_regs 2 or 3, not persistent, no tail: blocks in pairs, each
    # activation stage copied once for both (multicast; docs/PERF_GEMM.md #66; not inherited)
    xorder: int = 0  # wgmma with a_regs, no multicast: the activations copied straight from x,
    # no image pass (cuda_large.xorder_applies; docs/PERF_GEMM.md #83; not inherited)
    wreuse: int = 0  # wgmma, no multicast: a tile block's token blocks launched next to each
    # other, stream-K's units token block outermost (cuda_large.WREUSE for entries without
    # it; docs/PERF_GEMM.md #84-#85; not inherited)
    l2hint: int = 0  # wgmma: the bulk copies with L2 eviction hints, activations kept, weights
    # evicted first (cuda_large.L2HINT for entries without it; docs/PERF_GEMM.md #91; not
    # inherited)


@functools.cache
def large_rule(device: str | None = None) -> dict:
    """The ``large`` entry of ``tuned.json``: ``{"default": {...}, "max_m": rows, "shapes":
    {"NxK": {"M": {...}}}}`` (built-in defaults without it). With ``device`` (a GPU's name as
    torch reports it), that GPU's section of the entry (``"by_device": {name: {"shapes": ...,
    "max_m": ...}}``, written by ``gemm.py --sweep-large --write-table --device-table``)
    replaces the shared entries per shape and M class, and its ``max_m`` counts where larger:
    a sweep on one GPU model then leaves what another's sweeps chose (docs/PERF_GEMM.md #89:
    under full load an H100 runs at ~1.4 GHz, the H200's stamps suggest it holds more)."""
    table = json.loads(TUNED_PATH.read_text()) if TUNED_PATH.exists() else {}
    entry = table.get("large", {})
    shapes = entry.get("shapes", {})
    max_m = int(entry.get("max_m", DEFAULT_LARGE_MAX_M))
    section = entry.get("by_device", {}).get(device) if device else None
    if section:
        shapes = overlay_shapes(shapes, section.get("shapes", {}))
        max_m = max(max_m, int(section.get("max_m", 0)))
    return {"default": {**DEFAULT_LARGE, **entry.get("default", {})}, "max_m": max_m,
            "shapes": shapes}


def overlay_shapes(base: dict, over: dict) -> dict:
    """Large-M ``shapes`` ({"NxK": {"M": entry}}) with ``over``'s entries replacing ``base``'s
    per shape and M class; a shape's other classes stay (new dicts; neither input changes)."""
    shapes = {shape: dict(by_m) for shape, by_m in base.items()}
    for shape, by_m in over.items():
        shapes[shape] = {**shapes.get(shape, {}), **by_m}
    return shapes


def current_gpu(index: int | None = None) -> str | None:
    """The name of CUDA device ``index`` (torch's current one by default; None without a GPU):
    whose section of the large-M table ``large_config`` reads."""
    try:
        import torch
    except ImportError:  # (the table is plain JSON; the package needs no torch to read it)
        return None
    if index is None:  # (a given index is a GPU the caller's tensors are on: no check)
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
    return _gpu_name(index)


@functools.cache
def _gpu_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def large_config(n: int, k: int, m: int, r: dict | None = None,
                 device_index: int | None = None) -> LargeConfig:
    """How ``m`` rows beyond the small-M path multiply an (N, K) weight: the entry of the
    smallest measured M class >= ``m`` of the shape (or the default up to ``max_m``). Beyond
    what was measured, decode + cuBLAS: the fused kernels' time grows with M while the decode
    is paid once, so extrapolating a win at the largest measured class (2048 rows in the
    shipped table, where the warpgroup kernel still wins on every shape) to a longer prefill
    would be a guess (docs/PERF_GEMM.md #35; at 4096 rows decode + cuBLAS and the best fused
    choice were within a few percent of each other on an H100, #88). Without ``r``, the table
    as GPU ``device_index`` (default: the current one) sees it
    (``large_rule(current_gpu(device_index))``): the launcher passes the GPU holding the
    tensors, which need not be the current one."""
    r = r or large_rule(current_gpu(device_index))
    by_m = r["shapes"].get(f"{n}x{k}", {})
    classes = sorted(int(c) for c in by_m)
    if classes:
        cls = next((c for c in classes if m <= c), None)
        # (a shape's entry fills its gaps from the default, except ``persist``, ``tail``,
        # ``mcast``, ``xorder``, ``wreuse`` and ``l2hint``, valid only with some K splits and
        # operand modes or measured per entry: an entry without them has none of them)
        chosen = ({**r["default"], "persist": 0, "tail": 0, "mcast": 0, "xorder": 0,
                   "wreuse": 0, "l2hint": 0, **by_m[str(cls)]}
                  if cls is not None else {"kind": "decode"})
    else:
        chosen = r["default"] if m <= r.get("max_m", DEFAULT_LARGE_MAX_M) else {"kind": "decode"}
    cfg = LargeConfig(**chosen)
    if cfg.kind not in LARGE_KINDS:
        raise ValueError(f"large-M kind must be one of {LARGE_KINDS}, got {cfg.kind!r}")
    return cfg
