"""Benchmark: the certified INT8 LM head's INT8 product against the exact W12 head.

For each head shape (vocabulary x hidden: Qwen3's 151936 x 5120 and 151936 x 4096, Llama's
128256 x 4096) and each row count M, one CUDA graph per candidate, replayed in turn
(``harness.time_graphs``):

- ``w12``: the W12 head (the engine's exact head), ``w12_linear``'s dispatch;
- ``int8``: the INT8 head's approximate logits (``w12_kernels.int8_head.approx_logits``);
- ``int8+bounds``: that plus the certification: each row's norm, every entry's interval, the
  best lower bound and the candidate mask (torch ops on the device).

The exact recompute of the candidates is not timed (no kernel for it yet), so ``int8+bounds``
is a lower bound of the certified head's time. Before timing, every row's candidates are
checked to hold the exact head's argmax, and the reference's float64 bounds to hold the W12
head's logits (of the first 8,192 vocabulary rows). The weights are random (``0.02 N(0, 1)``),
the hidden states random with one outlier channel; random logits crowd the top, so the
candidate count printed here is far above a trained model's (``lab/int8_head_candidates.py``).

    python benchmarks/int8_head.py --m 1,8,32,64 --json results/int8_head.json
"""

from __future__ import annotations

import argparse

import torch
from harness import environment, project_on_path, time_graphs, write_json

project_on_path()

import w12  # noqa: E402
from w12_kernels.gemm import dispatch  # noqa: E402
from w12_kernels.gemm.layout import prepare_weight  # noqa: E402
from w12_kernels.int8_head import quantize  # noqa: E402
from w12_kernels.int8_head.launcher import approx_logits  # noqa: E402
from w12_kernels.int8_head.reference import EXTRA_TERMS, SAFETY, U_BF16, U_SUM  # noqa: E402

SHAPES = ((151936, 5120), (151936, 4096), (128256, 4096))


def w12_head(x, pw):
    return dispatch.linear(x, pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row,
                           pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order, pw.esc_entry,
                           pw.esc_fix, None, pw.n, pw.k)


def certify(x, q, scale, err, wsum, k):
    """The candidate mask on the device, float32 bounds widened as ``logit_bounds`` does
    (float32 here: the widening factor covers its own rounding at these sizes)."""
    approx = approx_logits(x, q, scale)
    hn = x.float().norm(dim=1, keepdim=True) * SAFETY
    n = k + EXTRA_TERMS
    gamma = n * U_SUM / (1 - n * U_SUM)
    radius = (hn * err[None, :] + gamma * hn * wsum[None, :] + U_SUM * approx.abs()) * 1.001
    lo, hi = approx - radius, approx + radius
    lo, hi = lo - U_BF16 * lo.abs(), hi + U_BF16 * hi.abs()
    return hi >= lo.amax(dim=1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", default="1,8,32,64")
    parser.add_argument("--json", default=None)
    a = parser.parse_args()
    env = environment()
    print(f"# {env['gpu']}")
    rows = []
    for v, k in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(v + k)
        weight = (torch.randn(v, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        pw = prepare_weight(w12.encode(weight))
        head = quantize(weight)  # (float64 on the device: a few GB for the largest head)
        q, scale = head.q, head.scale
        err, wsum = head.err.float(), (head.qnorm + head.norm).float()
        for m in map(int, a.m.split(",")):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            x[:, 7] = 30.0
            exact = w12_head(x, pw).float()
            mask = certify(x, q, scale, err, wsum, k)
            assert mask.gather(1, exact.argmax(1, keepdim=True)).all(), "argmax not a candidate"
            _check64(head, x.cpu(), exact.cpu())
            times = time_graphs(_calls(x, pw, q, scale, err, wsum, k))
            row = {"vocab": v, "k": k, "m": m, "w12_us": times[0], "int8_us": times[1],
                   "int8_bounds_us": times[2], "candidates_mean": float(mask.sum(1).float()
                                                                        .mean())}
            rows.append(row)
            print(f"{v:>7}x{k:<5} M={m:<3} W12 {times[0]:8.1f} us  INT8 {times[1]:8.1f} us "
                  f"(x{times[0] / times[1]:.2f})  INT8+bounds {times[2]:8.1f} us "
                  f"(x{times[0] / times[2]:.2f})  candidates {row['candidates_mean']:.1f}",
                  flush=True)
    write_json(a.json, rows, env)


def _calls(x, pw, q, scale, err, wsum, k, copies: int = 4) -> list[list]:
    return [[lambda: w12_head(x, pw)] * copies, [lambda: approx_logits(x, q, scale)] * copies,
            [lambda: certify(x, q, scale, err, wsum, k)] * copies]


def _check64(head, x, exact, rows: int = 8192):
    """The reference's float64 bounds hold the W12 head's logits (the first ``rows``
    vocabulary rows: a float64 product of the whole head takes minutes on the host)."""
    from w12_kernels.int8_head import Int8Head, logit_bounds

    part = Int8Head(*(t[:rows].cpu() for t in (head.q, head.scale, head.err, head.norm,
                                                head.qnorm)))
    _, lo, hi = logit_bounds(part, x)
    e = exact[:, :rows].double()
    assert ((lo <= e) & (e <= hi)).all(), "a W12 head logit outside its float64 bounds"


if __name__ == "__main__":
    main()
