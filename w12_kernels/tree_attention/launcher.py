"""Shape checks, the per-model configuration, and the launches of the tree-attention kernels.

The configuration is a function of the model's attention shape (G query heads per KV head,
head dim D) only: rows per program, keys per block, the number of splits, warps and stages are
compile-time constants, and a row's bits depend on them. Nothing in it may follow T, B, S or
the context length, or a tree node would stop matching the decode step at its position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from w12_kernels.device import launches_on_its_tensors

MAX_BLOCK_ROWS = 64


@dataclass(frozen=True)
class TreeAttentionConfig:
    """``block_rows`` query rows per program (nodes x G, padded to a power of two >= 16),
    ``block_keys`` positions per key block, block ``j`` in split ``j % splits``."""

    block_rows: int
    block_keys: int = 64
    splits: int = 16
    num_warps: int = 4
    num_stages: int = 2

    def nodes(self, g: int) -> int:
        return self.block_rows // g


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def default_config(g: int, d: int) -> TreeAttentionConfig:
    """At least four nodes per program where the tile allows it (the prefix blocks are loaded
    once for all of them): 16 rows (the decode kernel's tile) for G <= 4, 32 for G <= 8, at
    most 64 rows for D <= 64 and 32 for D = 128; eight warps from 32 rows up, four below (at
    16 rows and D = 128 four warps beat eight by 15-30% at batch 32 on an H100). With these,
    the sm_90 build of every G <= 8 at D = 64 and 128 spills no registers."""
    rows = max(16, _pow2(g), min(64 if d <= 64 else 32, _pow2(4 * g)))
    return TreeAttentionConfig(block_rows=rows, num_warps=8 if rows >= 32 else 4)


def _fail(msg: str) -> None:
    raise ValueError(f"tree_attention: {msg}")


def check_inputs(q, k_cache, v_cache, prefix_len, path_slots) -> tuple[int, int, int, int]:
    """(B, T, G, D) after checking shapes, dtypes and strides; raises ValueError naming them."""
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        _fail(f"q {tuple(q.shape)} must be [B, T, Hq, D] and k/v caches {tuple(k_cache.shape)}, "
              f"{tuple(v_cache.shape)} the same [B, Hkv, S, D]")
    b, t, hq, d = q.shape
    hkv = k_cache.shape[1]
    if k_cache.shape[0] != b or k_cache.shape[3] != d:
        _fail(f"q {tuple(q.shape)} and cache {tuple(k_cache.shape)} disagree on B or D")
    if hq % hkv or not 1 <= hq // hkv <= MAX_BLOCK_ROWS:
        _fail(f"{hq} query heads over {hkv} KV heads (needs 1..{MAX_BLOCK_ROWS} per KV head)")
    if d & (d - 1) or not 16 <= d <= 128:
        _fail(f"head dim {d} (needs a power of two in 16..128)")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dtype != torch.bfloat16:
            _fail(f"{name} is {x.dtype}, needs torch.bfloat16")
        if x.stride(3) != 1:
            _fail(f"{name} needs a contiguous head dim (stride {x.stride(3)})")
    if tuple(prefix_len.shape) != (b,) or path_slots.dim() != 3 or \
            tuple(path_slots.shape[:2]) != (b, t) or path_slots.shape[2] < 1:
        _fail(f"prefix_len {tuple(prefix_len.shape)} must be [{b}] and path_slots "
              f"{tuple(path_slots.shape)} [{b}, {t}, P >= 1]")
    for name, x in (("prefix_len", prefix_len), ("path_slots", path_slots)):
        if x.dtype not in (torch.int32, torch.int64):
            _fail(f"{name} is {x.dtype}, needs int32 or int64")
    devices = {x.device for x in (q, k_cache, v_cache, prefix_len, path_slots)}
    if len(devices) != 1:
        _fail(f"tensors on several devices: {sorted(map(str, devices))}")
    return b, t, hq // hkv, d


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   prefix_len: torch.Tensor, path_slots: torch.Tensor,
                   scale: float | None = None, *, config: TreeAttentionConfig | None = None,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of the T tree nodes of each request over the committed prefix and their own
    paths; [B, T, Hq * D] bf16 (into ``out`` when given). See the package docstring."""
    b, t, g, d = check_inputs(q, k_cache, v_cache, prefix_len, path_slots)
    if out is not None and (out.shape != (b, t, g * k_cache.shape[1] * d) or
                            out.dtype != torch.bfloat16 or not out.is_contiguous()):
        _fail(f"out {tuple(out.shape)} {out.dtype} must be a contiguous bf16 "
              f"[{b}, {t}, {g * k_cache.shape[1] * d}]")
    scale = d**-0.5 if scale is None else float(scale)
    if b * t == 0:
        return torch.zeros((b, t, q.shape[2] * d), dtype=q.dtype, device=q.device) \
            if out is None else out
    if q.device.type == "cuda":
        return launch_tree_attention(q, k_cache, v_cache, prefix_len, path_slots, scale,
                                     config or default_config(g, d), out)
    from w12_kernels.tree_attention.cpu import tree_attention_cpu

    result = tree_attention_cpu(q, k_cache, v_cache, prefix_len, path_slots, scale)
    return result if out is None else out.copy_(result)


@launches_on_its_tensors
def launch_tree_attention(q, k_cache, v_cache, prefix_len, path_slots, scale: float,
                          config: TreeAttentionConfig, out: torch.Tensor | None = None
                          ) -> torch.Tensor:
    """The split and combine kernels (on CPU tensors they run under ``TRITON_INTERPRET=1``)."""
    from w12_kernels.tree_attention import kernel

    b, t, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    nodes = config.nodes(g)
    if nodes < 1:
        _fail(f"block_rows {config.block_rows} < G = {g}")
    on_gpu = q.device.type == "cuda"
    path_slots = path_slots.contiguous()
    splits = config.splits
    c = scale * math.log2(math.e)
    m_ws = torch.empty((splits, b, t, hq), dtype=torch.float32, device=q.device)
    l_ws = torch.empty_like(m_ws)
    acc_ws = torch.empty((splits, b, t, hq, d), dtype=torch.float32, device=q.device)
    kernel.tree_attention_split_kernel[(_cdiv(t, nodes), splits, b * hkv)](
        q, k_cache, v_cache, prefix_len, path_slots, m_ws, l_ws, acc_ws,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        path_slots.stride(0), path_slots.stride(1),
        b, t, path_slots.shape[2], hkv, c,
        G=g, D=d, NODES=nodes, BLOCK_R=config.block_rows, BLOCK=config.block_keys,
        SPLITS=splits, ON_GPU=on_gpu, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if out is None:
        out = torch.empty((b, t, hq * d), dtype=q.dtype, device=q.device)
    rows = 8  # per combine program: all 16 splits' loads in flight without spilling
    kernel.tree_attention_combine_kernel[(_cdiv(t * hq, rows), b)](
        m_ws, l_ws, acc_ws, out, out.stride(0), out.stride(1), b, t, hq, c,
        D=d, ROWS=rows, SPLITS=splits, SPLITS_POW2=_pow2(splits), ON_GPU=on_gpu,
        num_warps=4,
    )
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_compact_inputs(k_all, v_all, src_slots, dst_start, count) -> None:
    if k_all.dim() != 5 or v_all.shape != k_all.shape:
        raise ValueError(f"compact_kv: caches {tuple(k_all.shape)}, {tuple(v_all.shape)} must "
                         "both be [layers, B, Hkv, S, D]")
    b, d = k_all.shape[1], k_all.shape[4]
    if src_slots.dim() != 2 or src_slots.shape[0] != b or tuple(dst_start.shape) != (b,) or \
            tuple(count.shape) != (b,):
        raise ValueError(f"compact_kv: src_slots {tuple(src_slots.shape)} must be [{b}, P], "
                         f"dst_start {tuple(dst_start.shape)} and count {tuple(count.shape)} "
                         f"[{b}]")
    if k_all.stride(4) != 1 or v_all.stride(4) != 1 or d & (d - 1) or d < 16:
        raise ValueError(f"compact_kv: head dim {d} must be a contiguous power of two >= 16")
    for name, x in (("src_slots", src_slots), ("dst_start", dst_start), ("count", count)):
        if x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"compact_kv: {name} is {x.dtype}, needs int32 or int64")


def compact_kv(k_all: torch.Tensor, v_all: torch.Tensor, src_slots: torch.Tensor,
               dst_start: torch.Tensor, count: torch.Tensor) -> None:
    """In place, every layer and head: slot ``src_slots[b, i]`` -> ``dst_start[b] + i`` for
    ``i < count[b]``. One launch on a GPU, no host sync (graph-capturable)."""
    check_compact_inputs(k_all, v_all, src_slots, dst_start, count)
    if src_slots.shape[1] == 0:
        return
    if k_all.device.type == "cuda":
        launch_compact_kv(k_all, v_all, src_slots, dst_start, count)
        return
    from w12_kernels.tree_attention.cpu import compact_kv_cpu

    compact_kv_cpu(k_all, v_all, src_slots, dst_start, count)


@launches_on_its_tensors
def launch_compact_kv(k_all, v_all, src_slots, dst_start, count, rows: int = 16) -> None:
    from w12_kernels.tree_attention import kernel

    layers, b, hkv, _, d = k_all.shape
    src_slots = src_slots.contiguous()
    kernel.compact_kv_kernel[(b * hkv, layers)](
        k_all, v_all, src_slots, dst_start, count,
        k_all.stride(0), k_all.stride(1), k_all.stride(2), k_all.stride(3),
        v_all.stride(0), v_all.stride(1), v_all.stride(2), v_all.stride(3),
        src_slots.stride(0), src_slots.shape[1], hkv, D=d, ROWS=rows,
    )
