"""Tree attention (``w12_kernels.tree_attention``) per layer, against the baselines it replaces.

Shapes: the attention of one layer of the demo model (Hq=9, Hkv=3, D=64), Qwen3-8B (32, 8, 128)
and Qwen3-32B (64, 8, 128), committed context L in {512, 2048, 8192}, T in {1, 4, 16, 64, 128}
tree nodes (random trees, nodes at slots L.. in node order) at batch 1, and T <= 16 at the
other batches (``--batches``, default 1 and 8).
Baselines, timed in the same run: at T=1 today's decode kernel
(``engine.attention_triton.decode_attention``); at T>1 torch SDPA over the whole cache with an
explicit boolean ancestor mask (what an implementation without the invariant kernel runs).
Each candidate is a CUDA graph of ``--calls`` calls (``harness.time_graphs``).

"KV MB" is the cache a layer must read at least once (B x Hkv x (L + T) x D x 2 tensors x 2
bytes); GB/s is that over the time. Before timing, each model's shape is checked on the GPU:
every node of a 16-node tree must have the bits of the decode step at its position
("bit-identical" column). ``compact_kv`` rows time one launch over all layers of a model (8
accepted tokens per request) against torch's advanced-index copy.

    python benchmarks/tree_attention.py --json results/tree_attention.json
    python benchmarks/tree_attention.py --models qwen3-8b --contexts 8192 --splits 8 --warps 4

A config override changes the bits of every row alike (the check above still holds); the
tests cover the default configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import random

import torch
import torch.nn.functional as F
from harness import environment, geomean, project_on_path, time_graphs, write_json

project_on_path()

from engine.attention_triton import decode_attention  # noqa: E402
from w12_kernels.tree_attention import compact_kv, default_config, tree_attention  # noqa: E402

MODELS = {"demo": (9, 3, 64, 30), "qwen3-8b": (32, 8, 128, 36), "qwen3-32b": (64, 8, 128, 64)}
CONTEXTS = (512, 2048, 8192)
NODES = (1, 4, 16, 64, 128)
BATCH8_MAX_T = 16


def tree_paths(t: int, rng: random.Random, start: int) -> list[list[int]]:
    """Paths (cache slots, root first) of a random tree of t nodes at slots start.."""
    paths: list[list[int]] = []
    for i in range(t):
        paths.append((paths[rng.randrange(i)] if i else []) + [start + i])
    return paths


def make_inputs(b, t, hq, hkv, d, context, seed=0, device="cuda"):
    """q, caches of room for the tree, prefix lengths, path slots and the boolean mask
    [B, T, S] of the slots each node sees (for SDPA)."""
    rng = random.Random(seed)
    s = -(-(context + max(NODES) + 64) // 64) * 64
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, t, hq, d, device=device, generator=gen).to(torch.bfloat16)
    k = torch.randn(b, hkv, s, d, device=device, generator=gen).to(torch.bfloat16)
    v = torch.randn(b, hkv, s, d, device=device, generator=gen).to(torch.bfloat16)
    prefix = torch.full((b,), context, dtype=torch.int64, device=device)
    rows = [tree_paths(t, rng, context) for _ in range(b)]
    width = max(len(p) for paths in rows for p in paths)
    path = torch.full((b, t, width), -1, dtype=torch.int32)
    visible = torch.zeros(b, t, s, dtype=torch.bool)
    visible[:, :, :context] = True
    for bi, paths in enumerate(rows):
        for ti, p in enumerate(paths):
            path[bi, ti, :len(p)] = torch.tensor(p)
            visible[bi, ti, p] = True
    return q, k, v, prefix, path.to(device), visible.to(device)


def sdpa_masked(q, k, v, visible, gqa=True):
    """SDPA over the whole cache with the boolean mask; ``gqa=False`` takes caches already
    expanded to Hq heads (for torch builds whose masked SDPA lacks ``enable_gqa``)."""
    b, t, hq, d = q.shape
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=visible[:, None],
                                         enable_gqa=gqa)
    return out.transpose(1, 2).reshape(b, t, hq * d)


def sdpa_baseline(q, k, v, visible):
    """A thunk of masked SDPA, with the GQA expansion done once outside it if need be."""
    try:
        sdpa_masked(q, k, v, visible)
        return "sdpa+mask", lambda: sdpa_masked(q, k, v, visible)
    except RuntimeError:
        g = q.shape[2] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return "sdpa+mask (kv x G)", lambda: sdpa_masked(q, k, v, visible, gqa=False)


def bit_identical(hq, hkv, d, config, device="cuda") -> bool:
    """Every node of a 16-node tree against a decode step at its position (same config)."""
    q, k, v, prefix, path, _ = make_inputs(1, 16, hq, hkv, d, 700, seed=1, device=device)
    tree = tree_attention(q, k, v, prefix, path, config=config)
    for t in range(16):
        nodes = path[0, t][path[0, t] >= 0]
        k2, v2 = k.clone(), v.clone()
        k2[0, :, 700:700 + len(nodes)] = k[0, :, nodes]
        v2[0, :, 700:700 + len(nodes)] = v[0, :, nodes]
        end = 700 + len(nodes) - 1
        single = tree_attention(q[:, t:t + 1], k2, v2, torch.full_like(prefix, end),
                                torch.full((1, 1, 1), end, dtype=torch.int32, device=device),
                                config=config)
        if not torch.equal(tree[0, t].view(torch.int16), single[0, 0].view(torch.int16)):
            return False
    return True


def time_case(model, b, t, context, calls, config_of) -> dict:
    hq, hkv, d, _ = MODELS[model]
    config = config_of(hq // hkv, d)
    q, k, v, prefix, path, visible = make_inputs(b, t, hq, hkv, d, context)
    ours = [lambda: tree_attention(q, k, v, prefix, path, config=config)] * calls
    if t == 1:
        base_name, pos = "decode_attention", prefix[:, None].clone()
        base = [lambda: decode_attention(q, k, v, pos)] * calls
    else:
        base_name, thunk = sdpa_baseline(q, k, v, visible)
        base = [thunk] * calls
    us_ours, us_base = time_graphs([ours, base])
    kv_bytes = b * hkv * (context + t) * d * 2 * 2
    return dict(model=model, batch=b, context=context, nodes=t, us=us_ours, base=base_name,
                base_us=us_base, kv_mb=kv_bytes / 1e6, gbs=kv_bytes / us_ours / 1e3,
                base_gbs=kv_bytes / us_base / 1e3, speedup=us_base / us_ours)


def time_compact(model, calls) -> dict:
    hq, hkv, d, layers = MODELS[model]
    s = 2048 + 256
    k = torch.randn(layers, 1, hkv, s, d, device="cuda").to(torch.bfloat16)
    v = torch.randn_like(k)
    rel = torch.tensor([[0, 2, 3, 5, 9, 10, 14, 15]], dtype=torch.int32, device="cuda")
    dst = torch.tensor([2048], dtype=torch.int32, device="cuda")
    src, count = rel + dst[:, None], torch.tensor([8], dtype=torch.int32, device="cuda")
    src_l, dst_l = src[0].long(), dst[0].long() + torch.arange(8, device="cuda")

    def index_copy():
        k[:, 0, :, dst_l] = k[:, 0, :, src_l]
        v[:, 0, :, dst_l] = v[:, 0, :, src_l]

    us_ours, us_base = time_graphs([[lambda: compact_kv(k, v, src, dst, count)] * calls,
                                    [index_copy] * calls])
    return dict(model=model, layers=layers, moved=8, us=us_ours, base="index copy",
                base_us=us_base, speedup=us_base / us_ours)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--contexts", nargs="+", type=int, default=list(CONTEXTS))
    ap.add_argument("--nodes", nargs="+", type=int, default=list(NODES))
    ap.add_argument("--calls", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8],
                    help="requests per call (trees above 16 nodes only at batch 1)")
    ap.add_argument("--block-rows", type=int, help="override the config's rows per program")
    ap.add_argument("--splits", type=int, help="override the config's number of splits")
    ap.add_argument("--block-keys", type=int, help="override the config's keys per block")
    ap.add_argument("--warps", type=int, help="override the config's warps per program")
    ap.add_argument("--json", help="write the rows and environment here")
    args = ap.parse_args()

    def config_of(g, d):
        config = default_config(g, d)
        changes = {"block_rows": args.block_rows, "splits": args.splits,
                   "block_keys": args.block_keys, "num_warps": args.warps}
        return dataclasses.replace(config, **{k: x for k, x in changes.items() if x})

    env = environment()
    print(f"# {env.get('gpu')}  commit {env['commit']}  torch {env['torch']}  "
          f"triton {env['triton']}")
    checks = {}
    for model in args.models:
        hq, hkv, d, _ = MODELS[model]
        checks[model] = bit_identical(hq, hkv, d, config_of(hq // hkv, d))
        print(f"# {model}: {config_of(hq // hkv, d)}  bit-identical: {checks[model]}")

    rows = []
    head = (f"{'model':10} {'B':>2} {'L':>5} {'T':>4} {'us':>8} {'GB/s':>7} {'baseline':>17} "
            f"{'base us':>8} {'base GB/s':>9} {'KV MB':>7} {'speedup':>7}")
    print(head)
    for model in args.models:
        for context in args.contexts:
            for b in args.batches:
                for t in args.nodes:
                    if b > 1 and t > BATCH8_MAX_T:
                        continue
                    r = time_case(model, b, t, context, args.calls, config_of)
                    rows.append(r)
                    print(f"{model:10} {b:>2} {context:>5} {t:>4} {r['us']:8.1f} "
                          f"{r['gbs']:7.0f} {r['base']:>17} {r['base_us']:8.1f} "
                          f"{r['base_gbs']:9.0f} {r['kv_mb']:7.2f} {r['speedup']:7.2f}")
    compact_rows = [time_compact(model, args.calls) for model in args.models]
    for r in compact_rows:
        print(f"compact_kv {r['model']:10} {r['layers']} layers, {r['moved']} rows: "
              f"{r['us']:.1f} us, {r['base']} {r['base_us']:.1f} us ({r['speedup']:.2f}x)")

    print("\n# ratios (baseline time / tree_attention time; > 1 is faster)")
    for model in args.models:
        decode = [r["speedup"] for r in rows if r["model"] == model and r["nodes"] == 1]
        tree = [r["speedup"] for r in rows if r["model"] == model and r["nodes"] > 1]
        if decode:
            print(f"{model:10} T=1 vs decode_attention: geomean {geomean(decode):.2f}, "
                  f"worst {min(decode):.2f}")
        if tree:
            print(f"{model:10} T>1 vs sdpa+mask:        geomean {geomean(tree):.2f}, "
                  f"worst {min(tree):.2f}")
    write_json(args.json, rows, env, compact=compact_rows, bit_identical=checks)


if __name__ == "__main__":
    main()
