"""The tuned table (``tuned.json``): which launch configuration a weight shape and a row count
get on a GPU.

Keys. Each section of the table holds what was measured on one kind of GPU, keyed by its
architecture and multiprocessor count, ``sm90-132`` (compute capability 9.0, 132
multiprocessors), and, where GPUs of that architecture and count need entries of their own, by
their memory too: ``sm90-132-80gib`` (an H100 80GB), ``sm90-132-140gib`` (an H200). The memory
class is the GPU's memory rounded to the nearest 20 GiB (79.2 GiB: 80; 139.8 GiB: 140).

Fallback. A GPU looks each entry up in, first to last: the section of its exact key
(architecture, multiprocessors, memory class); the section of its architecture and
multiprocessor count, or, where the table has none, the section of its architecture with the
nearest multiprocessor count; the built-in defaults (``DEFAULT_SMALL``; above the small-M rows,
decode + cuBLAS). The entries looked up one by one are: the small-M rule and its default
layout of each row class, each shape's small-M entry, the large-M default and ``max_m``, and
each shape's large-M entry of each row class. So a memory section holds only what differs on
that GPU; a GPU of another architecture gets the built-in defaults.

Writer. ``lab/tune_gemm.py`` writes this file, through its one ``write_table`` function;
nothing else does.

Small-M (``small_config``): for every M <= ``SMALL_M_MAX`` a weight uses one K split: ``kw``
warps share each 16-row tile, warp ``w`` summing its chunks ``w, w + kw, ...``, and the block
adds the ``kw`` partial tiles in a fixed order. So how K is split and summed never depends on
M (batch invariance). What may depend on M is only how the work is scheduled, per class of
``NT = ceil(M / 8)`` in (1, 2, 4, 8): chunk columns in flight, activations staged in shared
memory, 16-row tiles per block, a register cap, or the warpgroup-MMA kernel with the same split
(``Layout``); that changes no sum. 65..128 rows run as two passes of at most 64, or, where a
shape's entry names a ``one_pass`` schedule, as one pass of the warpgroup-MMA kernel with the
same split (the same bits). A shape the table lists has its ``kw``; other shapes get one from
the rule (``pick_kw``).

Large-M (``large_config``): past the small-M rows, the entry of the shape's smallest listed row
class >= M, a warpgroup-kernel configuration (``WglConfig``) or decode + cuBLAS; a shape
without entries takes the section's default up to ``max_m`` rows. Beyond the largest class
measured, decode + cuBLAS: the kernels' time grows with M while the decode is paid once, so a
win at the largest class measured says little about a longer prefill.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from w12_kernels.gemm.large.launcher import WglConfig

SMALL_M_MAX = 64
NT_CLASSES = (1, 2, 4, 8)
TUNED_PATH = Path(__file__).with_name("tuned.json")
MEMORY_STEP_GIB = 20  # the memory class's rounding

DEFAULT_SMALL = {
    "warps_per_sm": 16,  # aim: tiles * kw >= warps_per_sm * SMs
    "min_chunks_per_warp": 4,
    "max_kw": 8,
    "by_nt": {cls: {"depth": 2} for cls in ("1", "2", "4", "8")},
}
RULE_KEYS = ("warps_per_sm", "min_chunks_per_warp", "max_kw")


@dataclass(frozen=True)
class GpuKey:
    """What the table knows a GPU by."""

    arch: str  # "sm90": compute capability 9.0
    sms: int  # multiprocessors
    memory_gib: float  # total memory

    @property
    def memory_class(self) -> int:
        return MEMORY_STEP_GIB * round(self.memory_gib / MEMORY_STEP_GIB)

    @property
    def section(self) -> str:
        """The key of this architecture and multiprocessor count: ``sm90-132``."""
        return f"{self.arch}-{self.sms}"

    @property
    def exact(self) -> str:
        """The key with the memory class: ``sm90-132-140gib``."""
        return f"{self.section}-{self.memory_class}gib"


def gpu_key(index: int | None = None) -> GpuKey | None:
    """The key of CUDA device ``index`` (default: torch's current one; None without a GPU)."""
    import torch

    if index is None:
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
    return _gpu_key(index)


@functools.cache
def _gpu_key(index: int) -> GpuKey:
    import torch

    props = torch.cuda.get_device_properties(index)
    return GpuKey(f"sm{props.major}{props.minor}", props.multi_processor_count,
                  props.total_memory / 2**30)


@functools.cache
def load() -> dict:
    """The table's sections ({} without the file)."""
    if not TUNED_PATH.exists():
        return {}
    return json.loads(TUNED_PATH.read_text())["sections"]


def sections_for(key: GpuKey | None, sections: dict | None = None) -> list[dict]:
    """The sections ``key`` reads, most specific first (the module docstring's fallback)."""
    sections = load() if sections is None else sections
    if key is None:
        return []
    out = [sections[key.exact]] if key.exact in sections else []
    base = key.section
    if base not in sections:
        same = [name for name in sections if re.fullmatch(rf"{key.arch}-\d+", name)]
        base = min(same, key=lambda name: (abs(int(name.split("-")[1]) - key.sms),
                                           -int(name.split("-")[1])), default=None)
    if base is not None:
        out.append(sections[base])
    return out


def _first(parts: list[dict], name: str, default=None):
    return next((p[name] for p in parts if name in p), default)


@functools.cache
def _small_rule(key: GpuKey | None) -> dict:
    return small_rule_of(sections_for(key))


def small_rule(key: GpuKey | None = None) -> dict:
    """The small-M rule a GPU reads: ``{rule keys..., "by_nt": {class: layout}, "shapes":
    {"NxK": entry}}``, each item from the first section of its fallback that has it."""
    return _small_rule(key)


def small_rule_of(sections: list[dict]) -> dict:
    """``small_rule`` of the sections a GPU reads (most specific first)."""
    parts = [s["small_m"] for s in sections if "small_m" in s]
    rule = {name: _first(parts, name, DEFAULT_SMALL[name]) for name in RULE_KEYS}
    rule["by_nt"] = {cls: _first([p.get("by_nt", {}) for p in parts], cls,
                                 DEFAULT_SMALL["by_nt"][cls]) for cls in DEFAULT_SMALL["by_nt"]}
    shapes = {}
    for part in reversed(parts):
        shapes.update(part.get("shapes", {}))
    rule["shapes"] = shapes
    return rule


@dataclass(frozen=True)
class Layout:
    depth: int = 2  # chunk columns of loads in flight per warp
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

    def schedule(self) -> dict:
        """The mma.sync kernel's schedule (``small.launcher.gemm_small``'s keywords)."""
        return dict(depth=self.depth, tiles=self.tiles, min_blocks=self.min_blocks,
                    x_stages=self.x_stages, groups=self.groups, w_stages=self.w_stages,
                    cluster=self.cluster)


@dataclass(frozen=True)
class SmallConfig:
    kw: int
    by_nt: tuple[tuple[int, Layout], ...]  # (NT class, layout), classes ascending
    # 65..128 rows in one pass of the warpgroup-MMA kernel with 128-row blocks (the bits of
    # two 64-row passes, over the weight once): (stages, warpgroups, row groups, split) of
    # wgmma.gemm_wg, or None (two passes; also on a GPU without that kernel)
    one_pass: tuple[int, int, int, int] | None = None

    def layout(self, m: int) -> Layout:
        """The kernel layout for ``m`` activation rows (a clustered default layout on a shape
        whose kw the cluster does not divide runs unclustered, with the same register cap)."""
        nt = -(-m // 8)
        for cls, layout in self.by_nt:
            if nt <= cls:
                if self.kw % layout.cluster:
                    return replace(layout, cluster=1,
                                   min_blocks=max(1, layout.min_blocks // layout.cluster))
                return layout
        raise ValueError(f"{m} rows is more than the small-M path takes ({SMALL_M_MAX})")


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


def small_config(n: int, k: int, num_sms: int, rule: dict | None = None) -> SmallConfig:
    """The configuration used for every M <= SMALL_M_MAX on an (N, K) weight: the shape's
    entry where the table lists it, else the rule (``rule``: default, the current GPU's)."""
    r = small_rule(gpu_key()) if rule is None else rule
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


@functools.cache
def _large_rule(key: GpuKey | None) -> dict:
    return large_rule_of(sections_for(key))


def large_rule(key: GpuKey | None = None) -> dict:
    """The large-M table a GPU reads: ``{"default": entry or None, "max_m": rows, "shapes":
    {"NxK": {"M class": entry}}}``, each item from the first section of its fallback that has
    it (a shape's entries one row class at a time)."""
    return _large_rule(key)


def large_rule_of(sections: list[dict]) -> dict:
    """``large_rule`` of the sections a GPU reads (most specific first)."""
    parts = [s["large"] for s in sections if "large" in s]
    shapes: dict = {}
    for part in reversed(parts):
        for shape, by_m in part.get("shapes", {}).items():
            shapes[shape] = {**shapes.get(shape, {}), **by_m}
    return {"default": _first(parts, "default"), "max_m": int(_first(parts, "max_m", 0)),
            "shapes": shapes}


def entry_config(entry: dict | None) -> WglConfig | None:
    """A large-M entry as the kernel's configuration; None: decode + cuBLAS."""
    if entry is None or entry.get("kind") == "decode":
        return None
    if entry.get("kind") != "wgmma":
        raise ValueError(f"large-M entry kind must be 'wgmma' or 'decode', got {entry!r}")
    return WglConfig(**{name: v for name, v in entry.items() if name != "kind"})


def large_config(n: int, k: int, m: int, rule: dict | None = None,
                 device_index: int | None = None) -> WglConfig | None:
    """How ``m`` rows beyond the small-M path multiply an (N, K) weight: the warpgroup kernel's
    configuration, or None for decode + cuBLAS (module docstring). Without ``rule``, the table
    as GPU ``device_index`` (default: the current one) reads it: the dispatch passes the GPU
    holding the tensors, which need not be the current one."""
    r = large_rule(gpu_key(device_index)) if rule is None else rule
    by_m = r["shapes"].get(f"{n}x{k}", {})
    if by_m:
        cls = next((c for c in sorted(map(int, by_m)) if m <= c), None)
        return entry_config(by_m[str(cls)] if cls is not None else None)
    return entry_config(r["default"] if m <= r["max_m"] else None)
