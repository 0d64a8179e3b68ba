"""Host time per call of ``w12_linear`` and of the layers under it, against ``F.linear``.

    python lab/host_overhead.py [--profile]

A 512x512 weight, so the GPU work of a call is a few microseconds and back-to-back calls are
bound by the host: each line is wall time per call over ``--calls`` calls (after 100 untimed
ones), bracketed by device synchronisation. Layers: ``w12_linear`` (checks, then the op's body
or the registered op), the registered op ``torch.ops.w12.linear``, the dispatch (schedule
lookup and passes) and the CUDA small-M kernel call. ``--profile`` adds a cProfile of
``w12_linear`` per row count.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import w12  # noqa: E402
from w12_kernels.gemm import dispatch, prepare_weight, w12_linear  # noqa: E402
from w12_kernels.gemm.small import launcher as small  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", default="1,32,100")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("lab/host_overhead.py needs a CUDA GPU")
    t = (torch.randn(512, 512) * 0.02).to(torch.bfloat16)
    pw = prepare_weight(w12.encode(t), device="cuda")
    wb = t.cuda()
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, 512, device="cuda").to(torch.bfloat16)
        op_args = (x, pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                   pw.esc_val, pw.esc_delta, pw.esc_order,
                   pw.esc_entry, pw.esc_fix, None, pw.n, pw.k)
        line = {
            "F.linear": per_call_us(lambda x=x: torch.nn.functional.linear(x, wb), args.calls),
            "w12_linear": per_call_us(lambda x=x: w12_linear(x, pw), args.calls),
            "op": per_call_us(lambda a=op_args: torch.ops.w12.linear(*a), args.calls),
            "dispatch": per_call_us(lambda a=op_args: dispatch.linear(*a), args.calls),
        }
        if m <= 64 and dispatch.backend() == "cuda":
            cfg = dispatch.small_config(pw.n, pw.k, x.device)
            sched = dict(kw=cfg.kw, **cfg.layout(m).schedule())
            line["kernel call"] = per_call_us(
                lambda x=x, s=sched: small.gemm_small(x, pw.chunks, pw.scale, pw.esc_rowptr,
                                                      pw.esc_col, pw.esc_delta, None, pw.n,
                                                      pw.k, **s), args.calls)
        print(f"M={m}: " + ", ".join(f"{k} {v:.1f} us" for k, v in line.items()), flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                w12_linear(x, pw)
            prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
            print(text.getvalue())


if __name__ == "__main__":
    main()
