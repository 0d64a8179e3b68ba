"""Runs the INT8 head kernel under ``TRITON_INTERPRET=1`` (a fresh process) and prints one JSON
line: case id -> "ok" or the failure. ``test_int8_head.py`` starts it."""

from __future__ import annotations

# id: (vocabulary rows, K, hidden states[, (bv, bk) of the kernel's tile])
CASES = {
    "rows_1": (200, 96, 1),
    "rows_20_ragged": (131, 80, 20),
    "rows_64": (96, 128, 64),
    "rows_20_tile_32x128": (131, 300, 20, (32, 128)),
}


def check(v, k, r, tile=None):
    import torch

    from w12_kernels.int8_head import logit_bounds, quantize
    from w12_kernels.int8_head.launcher import DEFAULT, Int8HeadConfig, approx_logits

    g = torch.Generator().manual_seed(v + k + r)
    w = (torch.randn(v, k, generator=g) * 0.05).to(torch.bfloat16)
    h = (torch.randn(r, k, generator=g) * 2).to(torch.bfloat16)
    head = quantize(w)
    config = Int8HeadConfig(*tile) if tile else DEFAULT
    got = approx_logits(h, head.q, head.scale, config)
    want, lo, hi = logit_bounds(head, h)
    # float32 sums of exact products: within a few float32 ulps of the float64 product
    slack = 1e-5 * (h.double().abs() @ (head.q.double().abs().T)) * head.scale.double()
    assert ((got.double() - want).abs() <= slack + 1e-30).all(), "approx off"
    _, lo2, hi2 = logit_bounds(head, h, approx=got)  # bounds from the kernel's own product
    exact = (h @ w.T).float().double()
    assert ((lo2 <= exact) & (exact <= hi2)).all(), "bounds from the kernel miss the exact"


def check_greedy(v, k, r, tile=None):
    """The fused certification (bounds in the product's epilogue) keeps the exact head's
    argmax and is no wider than the torch path's candidates."""
    import torch

    from w12_kernels.int8_head import (
        DeviceHead,
        approx_logits,
        bounds32,
        candidates,
        greedy_candidates,
        quantize,
    )

    g = torch.Generator().manual_seed(v * k + r)
    w = (torch.randn(v, k, generator=g) * 0.05).to(torch.bfloat16)
    h = (torch.randn(r, k, generator=g) * 2).to(torch.bfloat16)
    h[:, 1] = 9.0  # clear winners for some rows, crowded tops for others
    head = DeviceHead.of(quantize(w))
    from w12_kernels.int8_head.launcher import DEFAULT, Int8HeadConfig

    fused = greedy_candidates(h, head, Int8HeadConfig(*tile) if tile else DEFAULT)
    lo, hi = bounds32(head, h, approx_logits(h, head.q, head.scale))
    torch_path = candidates(lo, hi)
    exact = (h @ w.T).float()
    assert fused.gather(1, exact.argmax(1, keepdim=True)).all(), "the argmax was dropped"
    assert not (fused & ~torch_path).any(), "wider than the torch path"
    assert fused.sum() >= torch_path.sum() - 2 * r, "much narrower than the torch path"


def main() -> None:
    from interp_harness import report

    jobs = {cid: (lambda c=c: check(*c)) for cid, c in CASES.items()}
    jobs.update({f"greedy_{cid}": (lambda c=c: check_greedy(*c)) for cid, c in CASES.items()})
    report(jobs)


if __name__ == "__main__":
    main()
