"""Probe of the experimental warpgroup-MMA W12 GEMM (``w12_kernels/gemm/wgmma.py``) on an H200.

For a few real layer shapes and M from 1 to 256 it checks the kernel against float64 on the
exact weights (error over cuBLAS's error, as ``benchmarks/gemm.py`` does), reports whether its
bits equal the production kernel's (mma.sync, same K split) for M <= 64, and times it against
cuBLAS and against the production path (``w12_linear``), all in alternating rounds
(``time_graphs``). One line per (shape, M), JSON with ``--json``.

    python benchmarks/wgmma_probe.py --json out/wgmma_probe.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm import Layer, default_run, time_graphs  # noqa: E402
from w12_kernels.gemm import cuda, launcher, wgmma  # noqa: E402

SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (10240, 5120),
          (128256, 4096)]
M_VALUES = [1, 8, 16, 32, 64, 128, 256]
CONFIGS = [(1, 2), (2, 2), (1, 4), (2, 4)]  # (kw, depth)


def _wg_runner(kw: int, depth: int):
    def run(x, pw):
        return wgmma.gemm_wg(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta,
                             None, pw.n, pw.k, kw=kw, depth=depth)
    return run


def probe(layer: Layer, m: int) -> dict:
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    runs = {"cublas": lambda x, i: torch.nn.functional.linear(x, layer.bf16[i]),
            "w12_linear": lambda x, i: default_run(x, layer.w12[i])}
    for kw, depth in CONFIGS:
        run = _wg_runner(kw, depth)
        runs[f"wg_kw{kw}_d{depth}"] = lambda x, i, run=run: run(x, layer.w12[i])
    ok, failed = {}, {}
    for label, run in runs.items():
        try:
            run(x, 0)
            ok[label] = run
        except Exception as exc:  # report it, time the others
            failed[label] = f"{type(exc).__name__}: {str(exc)[:200]}"
    times = time_graphs([[lambda i=i, r=run: r(x, i) for i in order] for run in ok.values()])
    ref = x.double() @ layer.bf16[0].double().T
    err_bf16 = float((ok["cublas"](x, 0).double() - ref).norm() / ref.norm())
    row = {"n": layer.n, "k": layer.k, "m": m, "failed": failed, "us": {}, "err_ratio": {},
           "bits_equal_small": {}}
    for (label, run), t in zip(ok.items(), times, strict=True):
        out = run(x, 0)
        row["us"][label] = t
        row["err_ratio"][label] = float((out.double() - ref).norm() / ref.norm()) / err_bf16
        row["finite"] = row.get("finite", True) and bool(torch.isfinite(out).all())
    pw = layer.w12[0]
    if m <= 64:
        kw_small = launcher.small_config(pw.n, pw.k, x.device).kw
        for kw in (1, 2):
            small = cuda.gemm_small(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col,
                                    pw.esc_delta, None, pw.n, pw.k, kw=kw, depth=2)
            if f"wg_kw{kw}_d2" in ok:
                wg = ok[f"wg_kw{kw}_d2"](x, 0)
                row["bits_equal_small"][f"kw{kw}"] = bool(
                    torch.equal(small.view(torch.int16), wg.view(torch.int16)))
        row["kw_production"] = kw_small
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not wgmma.available():
        sys.exit("needs a compute-capability 9.0 GPU and CuPy")
    torch.manual_seed(0)
    rows = []
    for n, k in SHAPES:
        layer = Layer(n, k, seed=n + k)
        for m in map(int, args.m.split(",")):
            r = probe(layer, m)
            rows.append(r)
            t = r["us"]
            best = min((v, lbl) for lbl, v in t.items() if lbl.startswith("wg_")) if any(
                lbl.startswith("wg_") for lbl in t) else (math.inf, "-")
            print(f"{n}x{k} M={m:<4} cublas {t.get('cublas', math.nan):8.1f} us  w12_linear "
                  f"{t.get('w12_linear', math.nan):8.1f} (x{t['cublas'] / t['w12_linear']:.2f})"
                  f"  best wgmma {best[1]} {best[0]:8.1f} (x{t['cublas'] / best[0]:.2f})  "
                  f"err/cublas {max(r['err_ratio'].values()):.3f}  finite {r.get('finite')}  "
                  f"bits=small {r['bits_equal_small']}  failed {list(r['failed'])}", flush=True)
        del layer
        torch.cuda.empty_cache()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    for m in sorted({r["m"] for r in rows}):
        sel = [r for r in rows if r["m"] == m and any(k.startswith("wg_") for k in r["us"])]
        if sel:
            g = math.exp(sum(math.log(r["us"]["cublas"] / min(
                v for lbl, v in r["us"].items() if lbl.startswith("wg_"))) for r in sel)
                / len(sel))
            p = math.exp(sum(math.log(r["us"]["cublas"] / r["us"]["w12_linear"]) for r in sel)
                         / len(sel))
            print(f"M={m:<4} geomean over cuBLAS: best wgmma x{g:.3f}, w12_linear x{p:.3f}")


if __name__ == "__main__":
    main()
