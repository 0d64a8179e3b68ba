"""What the tuning steps share: the project and its benchmark folder on the import path, the
benchmark's weight layers, candidates timed in alternation with cuBLAS (``harness``'s method)
and checked against float64 afterwards."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402
from harness import capture, geomean, time_graphs  # noqa: E402

from benchmarks.gemm import Layer, all_shapes, table_run  # noqa: E402
from w12_kernels.gemm.table import NT_CLASSES  # noqa: E402

__all__ = ["Layer", "all_shapes", "capture", "geomean", "measure", "nt_class", "parse_shapes",
           "precompile", "speedup", "table_run", "time_graphs"]


def nt_class(m: int) -> int:
    """The small-M class of ``m`` rows (``NT = ceil(m / 8)`` rounded up to 1, 2, 4 or 8)."""
    return next(c for c in NT_CLASSES if -(-m // 8) <= c)


def parse_shapes(text: str | None) -> list[tuple[int, int]]:
    """``"NxK,..."`` as (N, K) pairs; every shape of the benchmark's models without it."""
    if not text:
        return all_shapes()
    try:
        shapes = [tuple(int(v) for v in item.split("x")) for item in text.split(",")]
    except ValueError:
        raise SystemExit(f"tune_gemm: bad shapes {text!r} (NxK,...)") from None
    if any(len(s) != 2 for s in shapes):
        raise SystemExit(f"tune_gemm: bad shapes {text!r} (NxK,...)")
    return shapes


def speedup(r: dict | None) -> float:
    """The log speedup over cuBLAS of a timed row; -inf where it is missing, over the error
    budget (twice cuBLAS's error against float64) or not finite."""
    ok = r is not None and r["err_ratio"] <= 2 and math.isfinite(r["us"])
    return math.log(r["cublas_us"] / r["us"]) if ok else -math.inf


def measure(layer: Layer, m: int, runs: dict) -> tuple[float, dict]:
    """cuBLAS's µs and {label: (µs, error over cuBLAS's error)} for the thunk makers ``runs``
    (``run(x, weight)``), all timed in alternation, the errors checked afterwards; one line
    printed, fastest first (ERR where the error is over twice cuBLAS's). A candidate that does
    not compile or fit is reported and skipped."""
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    ok = {}
    for label, run in runs.items():
        try:
            run(x, layer.w12[0])
            ok[label] = run
        except Exception as exc:  # reported, the others timed
            print(f"  {label}: failed ({type(exc).__name__}: {str(exc)[:100]})", flush=True)
    times = time_graphs([[lambda i=i: torch.nn.functional.linear(x, layer.bf16[i])
                          for i in order]]
                        + [[lambda i=i, r=run: r(x, layer.w12[i]) for i in order]
                           for run in ok.values()])
    ref = x.double() @ layer.bf16[0].double().T
    err_bf16 = float((torch.nn.functional.linear(x, layer.bf16[0]).double() - ref).norm()
                     / ref.norm())
    results = {}
    for (label, run), t in zip(ok.items(), times[1:], strict=True):
        err = float((run(x, layer.w12[0]).double() - ref).norm() / ref.norm()) / err_bf16
        results[label] = (t, err)
    t_ref = times[0]
    ranked = sorted(results.items(), key=lambda kv: kv[1][0])
    print(f"{layer.n}x{layer.k} M={m}: cublas {t_ref:.2f} us; " + ", ".join(
        f"{lbl} {t:.2f} (x{t_ref / t:.2f}{'' if e <= 2 else f' ERR x{e:.0f}'})"
        for lbl, (t, e) in ranked), flush=True)
    return t_ref, results


def precompile(compile_one, names, workers: int) -> None:
    """``compile_one(name)`` for every name in ``workers`` processes (CuPy keeps each binary in
    its on-disk cache, where the timing's own compile then finds it): a fresh machine spends
    minutes compiling a sweep's kernels one after another otherwise."""
    import multiprocessing

    names = sorted(set(names))
    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in pool.imap_unordered(compile_one, names):
            pass
    print(f"compiled {len(names)} kernels in {workers} processes, {time.time() - t0:.0f} s",
          flush=True)
