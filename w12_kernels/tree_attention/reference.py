"""Readable float64 references of tree attention and KV compaction (loops, no blocking)."""

from __future__ import annotations

import torch


def visible_slots(prefix_len: int, path: list[int]) -> list[int]:
    """Cache slots of positions 0..L+depth in position order: the prefix, then the path up to
    its first -1 (empty for a padding node, whose path starts with -1)."""
    if not path or path[0] < 0:
        return []
    depth = next((i for i, s in enumerate(path) if s < 0), len(path))
    return list(range(prefix_len)) + list(path[:depth])


def reference_tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             prefix_len: torch.Tensor, path_slots: torch.Tensor,
                             scale: float | None = None) -> torch.Tensor:
    """float64 [B, T, Hq * D]: each node's heads attend, in float64, over the keys and values of
    the slots it sees (KV head = head // G); padding nodes are 0."""
    b, t, hq, d = q.shape
    g = hq // k_cache.shape[1]
    scale = d**-0.5 if scale is None else scale
    out = torch.zeros(b, t, hq, d, dtype=torch.float64)
    for bi in range(b):
        for ti in range(t):
            slots = visible_slots(int(prefix_len[bi]), path_slots[bi, ti].tolist())
            if not slots:
                continue
            index = torch.tensor(slots)
            keys = k_cache[bi][:, index].double().repeat_interleave(g, dim=0)  # [Hq, n, D]
            values = v_cache[bi][:, index].double().repeat_interleave(g, dim=0)
            scores = torch.einsum("hnd,hd->hn", keys, q[bi, ti].double()) * scale
            out[bi, ti] = torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=1), values)
    return out.view(b, t, hq * d)


def reference_compact_kv(k_all: torch.Tensor, v_all: torch.Tensor, src_slots: torch.Tensor,
                         dst_start: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor,
                                                                                torch.Tensor]:
    """New caches: each request's rows ``src_slots[b, :count[b]]`` copied, from the old
    caches, to slots ``dst_start[b], dst_start[b] + 1, ...``."""
    k_new, v_new = k_all.clone(), v_all.clone()
    for b in range(k_all.shape[1]):
        for i in range(int(count[b])):
            src, dst = int(src_slots[b, i]), int(dst_start[b]) + i
            k_new[:, b, :, dst] = k_all[:, b, :, src]
            v_new[:, b, :, dst] = v_all[:, b, :, src]
    return k_new, v_new
