"""Tiles of the INT8 head's product on the GPU: each configuration (``Int8HeadConfig``: rows
and columns a step, warps, stages) timed against the W12 head in the same CUDA-graph rounds
(``benchmarks/harness.time_graphs``), per head shape and row count M; the product checked
against the one ``config_for`` picks first (float32 sums in another order: within 1e-5 of the
sum of magnitudes). Prints every configuration's time and bytes a second, then the best per
(shape, M), and the tile ``launcher.config_for`` runs at that M. Random weights; the product's
speed does not depend on them.

    python lab/int8_head_sweep.py --m 1,16,64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

here = Path(__file__).resolve().parent
sys.path[:0] = [str(here.parent), str(here.parent / "benchmarks")]

from harness import environment, time_graphs  # noqa: E402

import w12  # noqa: E402
from w12_kernels.gemm import dispatch  # noqa: E402
from w12_kernels.gemm.layout import prepare_weight  # noqa: E402
from w12_kernels.int8_head import quantize  # noqa: E402
from w12_kernels.int8_head.launcher import (  # noqa: E402
    DEFAULT,
    Int8HeadConfig,
    approx_logits,
    config_for,
)

SHAPES = ((151936, 5120), (151936, 4096))
CONFIGS = [DEFAULT] + [Int8HeadConfig(bv, bk, warps, stages)
                       for bv, bk, warps, stages in ((64, 128, 4, 3), (64, 256, 4, 3),
                                                     (128, 128, 4, 3), (128, 128, 8, 3),
                                                     (32, 256, 4, 4), (64, 128, 8, 4),
                                                     (128, 256, 8, 3), (32, 128, 4, 4))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", default="1,16,64")
    a = parser.parse_args()
    print(f"# {environment()['gpu']}")
    for v, k in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(v + k)
        weight = (torch.randn(v, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        pw = prepare_weight(w12.encode(weight))
        head = quantize(weight)
        q, scale = head.q, head.scale
        del weight
        for m in map(int, a.m.split(",")):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            want = approx_logits(x, q, scale).double()
            slack = 1e-5 * (x.double().abs() @ q.double().abs().T) * scale.double()
            usable = []
            for cfg in CONFIGS:
                try:
                    got = approx_logits(x, q, scale, cfg).double()
                except Exception as exc:  # a tile the GPU cannot hold: reported, skipped
                    print(f"  {v}x{k} M={m} {cfg}: {type(exc).__name__}")
                    continue
                assert ((got - want).abs() <= slack).all(), f"{cfg}: product off"
                usable.append(cfg)
            times = time_graphs(_calls(x, pw, q, scale, usable))
            w12_us, best = times[0], None
            for cfg, us in zip(usable, times[1:], strict=True):
                tbs = v * k / us / 1e6
                print(f"{v:>7}x{k:<5} M={m:<3} bv {cfg.bv:>3} bk {cfg.bk:>3} warps "
                      f"{cfg.num_warps} stages {cfg.num_stages}: {us:7.1f} us {tbs:5.2f} TB/s "
                      f"x{w12_us / us:.2f} of the W12 head ({w12_us:.1f} us)", flush=True)
                best = min(best or (us, cfg), (us, cfg), key=lambda t: t[0])
            print(f"best {v}x{k} M={m}: {best[1]} {best[0]:.1f} us, x{w12_us / best[0]:.2f}; "
                  f"config_for runs {config_for(m)}")


def _calls(x, pw, q, scale, configs: list, copies: int = 4) -> list[list]:
    return [[lambda: w12_head(x, pw)] * copies] + [
        [lambda c=c: approx_logits(x, q, scale, c)] * copies for c in configs]


def w12_head(x, pw):
    return dispatch.linear(x, pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row,
                           pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order, pw.esc_entry,
                           pw.esc_fix, None, pw.n, pw.k)


if __name__ == "__main__":
    main()
