"""Runs the tree-attention Triton kernels under ``TRITON_INTERPRET=1`` (a fresh process: Triton
reads the variable when imported) and prints one JSON line: case id -> "ok" or the failure.

Importing this module only defines the cases and the helpers ``test_tree_attention.py`` shares
with it (random trees, the decode step equivalent to a node, the error budget).
``INTERP_CONFIG`` shrinks blocks to 16 keys and uses 3 splits, so that contexts of a few dozen
positions already cross blocks, leave splits idle and wrap around them.
"""

from __future__ import annotations

import random

# id: (B, T, Hq, Hkv, D, prefix lengths, padding nodes)
INTERP_CASES = {
    "t1_g3_d32_l37": (1, 1, 3, 1, 32, [37], 0),
    "t3_g4_d32_two_rows_l16_l41": (2, 3, 8, 2, 32, [16, 41], 0),
    "t17_g1_d16_l23_padding": (1, 17, 2, 2, 16, [23], 3),
    "t6_g8_d16_two_rows_l5_l50": (2, 6, 8, 1, 16, [5, 50], 1),
}
# id: (B, T, Hq, Hkv, D, prefix lengths, padding nodes, seed, the GPU's default config)
INVARIANCE_CASES = {
    "inv_t1_g3_l37": (1, 1, 3, 1, 32, [37], 0, 1, False),
    "inv_t7_g4_two_rows": (2, 7, 4, 1, 32, [16, 45], 1, 2, False),
    "inv_t12_g1_deep": (1, 12, 1, 1, 16, [30], 0, 3, False),
    "inv_t5_g8_default_config": (1, 5, 8, 1, 16, [70], 0, 4, True),
}
COMPACT_CASES = {  # id: (layers, B, Hkv, S, D, paths, dst_start)
    "compact_overlap_two_rows": (3, 2, 2, 40, 16, [[0, 2, 3], [1, 4]], [10, 20]),
    "compact_count_zero": (2, 1, 1, 24, 16, [[]], [5]),
    "compact_long_path_chunks": (2, 2, 1, 90, 32, [list(range(0, 40, 2)), [3]], [30, 50]),
}


def interp_config(g: int):
    from w12_kernels.tree_attention import TreeAttentionConfig

    return TreeAttentionConfig(block_rows=max(16, 1 << (g - 1).bit_length()), block_keys=16,
                               splits=3)


# ----------------------------------------------------------------------------- trees and cases


def random_tree(n: int, rng: random.Random) -> list[int]:
    """Parent of each node (-1 for the root) of a random tree on n nodes, the nodes numbered
    in a random topological order (every parent before its children)."""
    parent = [-1] + [rng.randrange(i) for i in range(1, n)]
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)
    order, ready = [], [0]
    while ready:
        order.append(ready.pop(rng.randrange(len(ready))))
        ready += children.get(order[-1], [])
    rank = {node: i for i, node in enumerate(order)}
    return [-1 if parent[node] < 0 else rank[parent[node]] for node in order]


def tree_paths(parent: list[int], slots: list[int]) -> list[list[int]]:
    """Each node's path from the root as cache slots, the root first."""
    paths: list[list[int]] = []
    for i, p in enumerate(parent):
        paths.append((paths[p] if p >= 0 else []) + [slots[i]])
    return paths


def make_case(b, t, hq, hkv, d, prefixes, pad=0, seed=0, spare=5):
    """Random q and caches, and for each request a random tree of ``t - pad`` nodes whose keys
    sit at random slots past the prefix (``pad`` padding nodes at random places in the node
    order). Returns (q, k, v, prefix_len, path_slots)."""
    import torch

    rng = random.Random(seed)
    s = max(prefixes) + t + spare
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hq, d, generator=gen).to(torch.bfloat16)
    k = torch.randn(b, hkv, s, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(b, hkv, s, d, generator=gen).to(torch.bfloat16)
    rows = []
    for length in prefixes:
        real = t - pad
        slots = rng.sample(range(length, length + real + spare), real)
        paths = tree_paths(random_tree(real, rng), slots) if real else []
        for at in sorted(rng.sample(range(t), pad)):
            paths.insert(at, [])
        rows.append(paths)
    width = max([len(p) for paths in rows for p in paths] + [1]) + rng.randrange(2)
    path = torch.full((b, t, width), -1, dtype=torch.int32)
    for bi, paths in enumerate(rows):
        for ti, p in enumerate(paths):
            path[bi, ti, :len(p)] = torch.tensor(p, dtype=torch.int32)
    return q, k, v, torch.tensor(prefixes, dtype=torch.int64), path


def decode_step_of_node(q, k, v, prefix_len, path_slots, t):
    """The T=1 inputs of a plain decode step at node t's position: a copy of the caches whose
    slots L..L+depth hold the node's path keys in order, L' = L + depth, path [L'] (a padding
    node stays padding)."""
    import torch

    k2, v2 = k.clone(), v.clone()
    prefix2 = prefix_len.clone()
    path2 = torch.full((q.shape[0], 1, 1), -1, dtype=path_slots.dtype, device=path_slots.device)
    for b in range(q.shape[0]):
        path = [s for s in path_slots[b, t].tolist()]
        path = path[:path.index(-1)] if -1 in path else path
        if not path:
            continue
        at = int(prefix_len[b])
        k2[b, :, at:at + len(path)] = k[b, :, path]
        v2[b, :, at:at + len(path)] = v[b, :, path]
        prefix2[b] = at + len(path) - 1
        path2[b, 0, 0] = at + len(path) - 1
    return q[:, t:t + 1].contiguous(), k2, v2, prefix2, path2


def invariance_failures(attend, case) -> list[str]:
    """Nodes whose output bits differ from the decode step at their position (``attend`` takes
    (q, k, v, prefix_len, path_slots) and returns [B, T, Hq * D])."""
    import torch

    q, k, v, prefix_len, path_slots = case
    tree = attend(q, k, v, prefix_len, path_slots)
    bad = []
    for t in range(q.shape[1]):
        single = attend(*decode_step_of_node(q, k, v, prefix_len, path_slots, t))
        for b in range(q.shape[0]):
            if not torch.equal(tree[b, t].view(torch.int16), single[b, 0].view(torch.int16)):
                bad.append(f"b={b} t={t}")
    return bad


# ------------------------------------------------------------------------------- error budget

BUDGET = 2.0  # x the relative RMS error of rounding the float64 reference to bf16


def rel_err(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def check_budget(out, ref) -> float:
    """The output is finite and its relative RMS error against the float64 reference is at most
    ``BUDGET`` times that of the reference rounded to bf16 (~1.1e-3 on random inputs: the
    rounding is the error floor of any bf16 output). Returns the ratio."""
    import torch

    assert torch.isfinite(out.float()).all(), "non-finite output (NaN poison left unwritten?)"
    floor = rel_err(ref.to(torch.bfloat16), ref)
    ratio = rel_err(out, ref) / floor
    assert ratio <= BUDGET, f"error {rel_err(out, ref):.3e} = {ratio:.2f} x bf16 rounding"
    return ratio


def poisoned(b, t, hq, d):
    import torch

    return torch.full((b, t, hq * d), float("nan"), dtype=torch.bfloat16)


# ------------------------------------------------------------------------------------ compact


def compact_inputs(layers, b, hkv, s, d, paths, dst_start, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(layers, b, hkv, s, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(layers, b, hkv, s, d, generator=gen).to(torch.bfloat16)
    width = max([len(p) for p in paths] + [1])
    src = torch.full((b, width), -1, dtype=torch.int32)
    rel = torch.zeros(b, width, dtype=torch.int32)
    for bi, p in enumerate(paths):
        rel[bi, :len(p)] = torch.tensor(p, dtype=torch.int32)
        src[bi, :len(p)] = rel[bi, :len(p)] + dst_start[bi]
    count = torch.tensor([len(p) for p in paths], dtype=torch.int32)
    return k, v, src, torch.tensor(dst_start, dtype=torch.int32), count


def check_compact(compact, case, device="cpu"):
    """``compact`` leaves the caches bit-equal to the reference (every layer, head and the
    untouched slots)."""
    import torch

    from w12_kernels.tree_attention.reference import reference_compact_kv

    k, v, src, dst, count = compact_inputs(*case)
    want_k, want_v = reference_compact_kv(k, v, src, dst, count)
    k, v = k.to(device), v.to(device)
    compact(k, v, src.to(device), dst.to(device), count.to(device))
    assert torch.equal(k.cpu().view(torch.int16), want_k.view(torch.int16)), "k cache differs"
    assert torch.equal(v.cpu().view(torch.int16), want_v.view(torch.int16)), "v cache differs"


# -------------------------------------------------------------------------------- interpreter


def _interp_attend(config):
    from w12_kernels.tree_attention.launcher import launch_tree_attention

    def attend(q, k, v, prefix_len, path_slots, out=None):
        return launch_tree_attention(q, k, v, prefix_len, path_slots, q.shape[-1] ** -0.5,
                                     config, out)

    return attend


def _budget_job(b, t, hq, hkv, d, prefixes, pad):
    from w12_kernels.tree_attention.reference import reference_tree_attention

    case = make_case(b, t, hq, hkv, d, prefixes, pad, seed=t)
    out = _interp_attend(interp_config(hq // hkv))(*case, out=poisoned(b, t, hq, d))
    check_budget(out, reference_tree_attention(*case))


def _invariance_job(b, t, hq, hkv, d, prefixes, pad, seed, gpu_config):
    from w12_kernels.tree_attention import default_config

    config = default_config(hq // hkv, d) if gpu_config else interp_config(hq // hkv)
    bad = invariance_failures(_interp_attend(config), make_case(b, t, hq, hkv, d, prefixes,
                                                                pad, seed))
    assert not bad, f"{len(bad)} nodes differ from their decode step: {bad[:5]}"


def _partition_job():
    """A decode step run with another split count gives other bits for some node: the
    invariance check sees a change of partition."""
    import dataclasses

    from w12_kernels.tree_attention.launcher import launch_tree_attention

    case = make_case(1, 9, 4, 1, 32, [50], 0, seed=7)
    config = interp_config(4)
    other = dataclasses.replace(config, splits=2)
    tree = launch_tree_attention(*case, 32**-0.5, config)
    differ = 0
    import torch

    for t in range(9):
        single = launch_tree_attention(*decode_step_of_node(*case, t), 32**-0.5, other)
        differ += not torch.equal(tree[0, t].view(torch.int16), single[0, 0].view(torch.int16))
    assert differ > 0, "a different split partition gave the same bits for every node"


def _compact_job(case):
    from w12_kernels.tree_attention.launcher import launch_compact_kv

    check_compact(launch_compact_kv, case)


def main() -> None:
    from interp_harness import report

    jobs = {cid: (lambda c=c: _budget_job(*c)) for cid, c in INTERP_CASES.items()}
    jobs |= {cid: (lambda c=c: _invariance_job(*c)) for cid, c in INVARIANCE_CASES.items()}
    jobs["partition_change_is_seen"] = _partition_job
    jobs |= {cid: (lambda c=c: _compact_job(c)) for cid, c in COMPACT_CASES.items()}
    report(jobs)


if __name__ == "__main__":
    main()
