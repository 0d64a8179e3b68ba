"""Runs the GEMM kernels under ``TRITON_INTERPRET=1`` at small awkward shapes (a fresh process:
Triton reads the variable when imported). Prints one JSON line: case id -> "ok" or the failure.

Importing this module only defines the cases; ``test_gemm.py`` starts it as a script.
"""

from __future__ import annotations

import json
import traceback

CASES = {  # id: (m, n, k, block_n, block_k, split, block_m, max_chunks)
    "m1_n1_k100": (1, 1, 100, 16, 64, 1, 16, 4),
    "m3_n37_k250_split2": (3, 37, 250, 16, 64, 2, 16, 4),
    "m17_n70_k500_split4": (17, 70, 500, 32, 64, 4, 16, 4),
    "m3_n130_k256_bk128": (3, 130, 256, 16, 128, 2, 16, 4),
    "m40_n33_k200_wide_tile": (40, 33, 200, 16, 64, 1, 32, 1),
}
CASE_IDS = [*CASES, "decode_kernel_exact"]


def _gemm_case(m, n, k, block_n, block_k, split, block_m, chunks):
    import torch
    from gemm_helpers import assert_within_budget, encoded, make_weight

    from w12_kernels.gemm import config as cfgs
    from w12_kernels.gemm import launcher, prepare_weight
    from w12_kernels.gemm.reference import reference_linear

    t = make_weight(n, k, seed=m + n + k + split)
    w = encoded(t)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(torch.bfloat16)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    cfg = cfgs.GemmConfig(block_n=block_n, block_k=block_k, split_k=split, num_warps=4,
                          num_stages=1, block_m=block_m, max_chunks=chunks, esc_chunk=8)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)  # poison
    launcher.launch_packed(x, prepare_weight(w), bias, cfg, on_gpu=False, out=out)
    assert_within_budget(out, x, t, reference_linear(x, w, bias), bias)


def _decode_case():
    import torch
    from gemm_helpers import encoded, make_weight

    from w12_kernels.gemm import launcher, prepare_weight

    t = make_weight(45, 333, seed=9)
    d = launcher.decode(prepare_weight(encoded(t)), block_n=16, block_k=64, on_gpu=False)
    assert torch.equal(d.view(torch.int16), t.view(torch.int16)), "decoded bits differ"


def main() -> None:
    verdicts = {}
    jobs = {cid: (lambda c=c: _gemm_case(*c)) for cid, c in CASES.items()}
    jobs["decode_kernel_exact"] = _decode_case
    for cid, job in jobs.items():
        try:
            job()
            verdicts[cid] = "ok"
        except Exception:  # report every case, not just the first failure
            verdicts[cid] = traceback.format_exc(limit=3)[-1500:]
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main()
