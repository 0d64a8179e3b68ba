"""Runs the Triton decode-attention kernel under ``TRITON_INTERPRET=1`` (a fresh process:
Triton reads the variable when imported) and prints one JSON line: case id -> "ok" or the
failure. ``test_attention_triton.py`` starts it as a script and imports the cases from here.
"""

from __future__ import annotations

# id: (batch, steps T, query heads, KV heads, head dim, cache slots S, positions per row)
CASES = {
    "decode_g4_d64_s100_two_rows": (2, 1, 8, 2, 64, 100, [[37], [99]]),
    "decode_g3_d64_s64_first_slot": (1, 1, 9, 3, 64, 64, [[0]]),
    "verify_t3_g4_d32_s130": (2, 3, 8, 2, 32, 130, [[64, 65, 66], [3, 4, 5]]),
    "tree_rows_same_position_g2_d128": (1, 4, 4, 2, 128, 80, [[70, 71, 71, 72]]),
    "group_fills_block_g8_t2_d64": (1, 2, 16, 2, 64, 70, [[68, 69]]),
}


# write_kv cases, id: (batch, steps T, KV heads, head dim, cache slots S, positions per row)
KV_CASES = {
    "kv_decode_two_rows": (2, 1, 2, 64, 100, [[37], [99]]),
    "kv_prefill_t20_block_not_full": (1, 20, 3, 32, 40, [list(range(20))]),
    "kv_verify_t3_d128": (2, 3, 2, 128, 130, [[64, 65, 66], [3, 4, 5]]),
}


def check_kv_case(b, t, h, d, s, positions, kernel=None, device="cpu"):
    """write_kv leaves the caches bit-equal to two ``scatter_`` calls, with the new rows taken
    as strided views of a fused projection (as the model splits them)."""
    import torch

    from engine.attention_triton import write_kv

    gen = torch.Generator().manual_seed(1)
    kc = torch.randn(b, h, s, d, generator=gen).to(torch.bfloat16).to(device)
    vc = torch.randn(b, h, s, d, generator=gen).to(torch.bfloat16).to(device)
    fused = torch.randn(b, t, 3 * h * d, generator=gen).to(torch.bfloat16).to(device)
    _, k, v = fused.split([h * d, h * d, h * d], dim=-1)
    k, v = k.view(b, t, h, d), v.view(b, t, h, d)
    pos = torch.tensor(positions, dtype=torch.long, device=device)
    want_k, want_v = kc.clone(), vc.clone()
    index = pos[:, None, :, None].expand(b, h, t, d)
    want_k.scatter_(2, index, k.transpose(1, 2))
    want_v.scatter_(2, index, v.transpose(1, 2))
    write_kv(kc, vc, pos, k, v, kernel=kernel)
    assert torch.equal(kc.view(torch.int16), want_k.view(torch.int16)), "k cache differs"
    assert torch.equal(vc.view(torch.int16), want_v.view(torch.int16)), "v cache differs"


def inputs(b, t, hq, hkv, d, s, positions, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hq, d, generator=gen).to(torch.bfloat16)
    k = torch.randn(b, hkv, s, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(b, hkv, s, d, generator=gen).to(torch.bfloat16)
    pos = torch.tensor(positions, dtype=torch.long)
    return q, k, v, pos


def reference(q, k, v, pos):
    """float64 attention: query (b, t, head) sees slots 0..pos[b, t] of KV head head // G."""
    import torch

    b, t, hq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = hq // hkv
    kk = k.double().repeat_interleave(g, dim=1)  # [B, Hq, S, D]
    vv = v.double().repeat_interleave(g, dim=1)
    scores = torch.einsum("bthd,bhsd->bths", q.double(), kk) * d**-0.5
    visible = torch.arange(s)[None, None, None, :] <= pos[:, :, None, None]
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("bths,bhsd->bthd", probs, vv).reshape(b, t, hq * d)


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


def check_case(b, t, hq, hkv, d, s, positions, kernel=None):
    """The Triton kernel is within 2x the torch path's error against float64 (finite)."""
    import torch

    from engine import ops
    from engine.attention_triton import decode_attention

    q, k, v, pos = inputs(b, t, hq, hkv, d, s, positions)
    want = reference(q, k, v, pos)
    got = decode_attention(q.to(k.device), k, v, pos, kernel=kernel)
    assert torch.isfinite(got.float()).all(), "non-finite output"
    visible = torch.arange(s)[None, None, :] <= pos[:, :, None]
    torch_path = ops.cached_attention(q, k, v, visible)
    budget = 2 * rel_err(torch_path, want)
    assert rel_err(got, want) <= budget, f"error {rel_err(got, want):.2e} > budget {budget:.2e}"


def main() -> None:
    from interp_harness import report

    report({cid: (lambda c=c: check_case(*c)) for cid, c in CASES.items()}
           | {cid: (lambda c=c: check_kv_case(*c)) for cid, c in KV_CASES.items()})


if __name__ == "__main__":
    main()
