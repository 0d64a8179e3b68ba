"""Runs the view GEMM's Triton kernels under ``TRITON_INTERPRET=1`` (a fresh process) and prints
one JSON line: case id -> "ok" or the failure. ``test_view8.py`` starts it."""

from __future__ import annotations

# id: (m, n, k, bias, config (block_n, block_m, block_k, split[, warps, stages, gemv]) or None for
# the launcher's own)
CASES = {
    "m1_n37_k200": (1, 37, 200, False, None),
    "m20_n131_k300_bias": (20, 131, 300, True, None),
    "m70_n33_k200_block_m_128": (70, 33, 200, True, None),
    "m5_n64_k1100_split_4_uneven": (5, 64, 1100, True, (32, 16, 64, 4)),
    "m3_n40_k2048_split_8": (3, 40, 2048, False, (16, 16, 128, 8)),
    "m17_n50_k96_one_block": (17, 50, 96, False, (64, 32, 256, 1)),
    "gemv_m1_n37_k200": (1, 37, 200, True, (16, 1, 64, 1, 4, 3, True)),
    "gemv_m3_n64_k1100_rows_2_split_4": (3, 64, 1100, True, (32, 2, 64, 4, 4, 3, True)),
    "gemv_m4_n131_k300_rows_4": (4, 131, 300, False, (16, 4, 128, 1, 4, 3, True)),
}


def check(m, n, k, with_bias, config):
    import torch
    from gemm_helpers import assert_within_budget, make_weight

    from w12.tensor import encode
    from w12_kernels.view8 import prepare_view, view_bf16
    from w12_kernels.view8.launcher import View8Config, gemm
    from w12_kernels.view8.reference import reference_view

    t = make_weight(n, k, seed=m + n + k)
    w = encode(t)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(torch.bfloat16)
    bias = (torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
            if with_bias else None)
    c = View8Config(*config) if config else None
    out = gemm(x, prepare_view(w), bias, config=c, on_gpu=False)
    ref = x.double() @ reference_view(w).T
    if bias is not None:
        ref = ref + bias.double()
    assert_within_budget(out, x, view_bf16(w), ref, bias)


def main() -> None:
    from interp_harness import report

    report({cid: (lambda c=c: check(*c)) for cid, c in CASES.items()})


if __name__ == "__main__":
    main()
