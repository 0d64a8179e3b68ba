"""A/B of the small-M W12 kernel: ``kernels.cu`` and ``cuda.py`` at a git revision (the
baseline) against the working tree, on an H200 (or any GPU the kernels run on).

For every distinct layer shape of the benchmark's models and each M, both versions run the
schedule the tree's table gives that shape (``launcher.small_config``; the mma.sync kernel
``gemm_small``, a table's warpgroup schedule is not used), the outputs are compared bit for
bit (with and without a bias), and both are timed with cuBLAS in the same CUDA graphs
(``time_graphs``: alternating rounds, weights rotated past the L2). One line per (shape, M);
last, per M, the geometric-mean speedup over cuBLAS of each version. A change that must not
change a sum (a schedule, an epilogue) is measured this way: any shape whose bits differ is
listed and the script exits 1. The baseline runs with its own ``cuda.py`` (its instantiation
names, shared-memory sizes and launch), so the two kernels' arguments may differ.

    python benchmarks/gemm_ab.py --baseline HEAD~1 --m 1,16,32 --json out/gemm_ab.json
    python benchmarks/gemm_ab.py --baseline saved/  # saved/kernels.cu and saved/cuda.py
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gemm import LAYOUT_KEYS, SWEEP_SHAPES, Layer, time_with_cublas  # noqa: E402
from benchmarks.revision import KERNELS, cuda_module, source_at  # noqa: E402
from w12_kernels.gemm import cuda, launcher  # noqa: E402


def baseline_module(rev: str, scratch: Path) -> types.ModuleType:
    """``cuda.py`` at ``rev`` as a module of its own (its own compile and launch caches),
    compiling ``kernels.cu`` at ``rev`` (written to ``scratch``)."""
    kernels = scratch / "kernels.cu"
    kernels.write_text(source_at(rev, KERNELS, "gemm_ab"))
    module = cuda_module(rev, "w12_ab_baseline_cuda", "gemm_ab")
    module.SOURCE_PATH = kernels
    return module


def runner(module: types.ModuleType, kw: int, layout):
    sched = {key: getattr(layout, key) for key in LAYOUT_KEYS}

    def run(x, pw, bias=None):
        return module.gemm_small(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col,
                                 pw.esc_delta, bias, pw.n, pw.k, kw=kw, **sched)
    return run


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def geomeans(rows: list[dict]) -> dict[int, dict[str, float]]:
    """Per M, the geometric-mean speedup over cuBLAS of the baseline and of the tree."""
    out = {}
    for m in sorted({r["m"] for r in rows}):
        mine = [r for r in rows if r["m"] == m]
        out[m] = {side: math.exp(sum(math.log(r["cublas_us"] / r[f"{side}_us"]) for r in mine)
                                 / len(mine))
                  for side in ("baseline", "tree")}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="HEAD",
                        help="git revision, or a directory holding a revision's kernels.cu "
                             "and cuda.py (default HEAD)")
    parser.add_argument("--m", default="1,16,32")
    parser.add_argument("--shapes", default=None, help="NxK shapes, comma-separated "
                                                       "(default: every benchmark shape)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    m_values = [int(v) for v in args.m.split(",")]
    if any(not 1 <= m <= 64 for m in m_values):
        raise SystemExit("gemm_ab: M must be 1..64 (the small-M kernel)")
    shapes = ([tuple(map(int, v.split("x"))) for v in args.shapes.split(",")]
              if args.shapes else SWEEP_SHAPES)
    if not cuda.available():
        raise SystemExit("gemm_ab: needs a CUDA GPU and CuPy")
    torch.manual_seed(0)
    device = torch.device("cuda")
    rows, differ = [], []
    with tempfile.TemporaryDirectory() as scratch:
        base = baseline_module(args.baseline, Path(scratch))
        print(f"{'shape':>12} {'M':>3} {'baseline':>9} {'tree':>9} {'cublas':>9} "
              f"{'tree/base':>9} bits", flush=True)
        for n, k in shapes:
            layer = Layer(n, k, seed=n + k)
            cfg = launcher.small_config(n, k, device)
            bias = torch.randn(n, device=device).to(torch.bfloat16)
            for m in m_values:
                lay = cfg.layout(m)
                x = torch.randn(m, k, device=device).to(torch.bfloat16)
                a, b = runner(base, cfg.kw, lay), runner(cuda, cfg.kw, lay)
                same = all(same_bits(a(x, layer.w12[0], q), b(x, layer.w12[0], q))
                           for q in (None, bias))
                t_a, t_b, t_ref = time_with_cublas(layer, x, [a, b])
                rows.append(dict(n=n, k=k, m=m, kw=cfg.kw, baseline_us=t_a, tree_us=t_b,
                                 cublas_us=t_ref, same_bits=same))
                if not same:
                    differ.append(f"{n}x{k} M={m}")
                print(f"{n:>6}x{k:<5} {m:>3} {t_a:9.2f} {t_b:9.2f} {t_ref:9.2f} "
                      f"{t_b / t_a:9.3f} {'same' if same else 'DIFFER'}", flush=True)
            del layer
            torch.cuda.empty_cache()
    means = geomeans(rows)
    for m, g in means.items():
        print(f"geomean speedup M={m:<3} baseline x{g['baseline']:.3f}  tree x{g['tree']:.3f}")
    if differ:
        print(f"bits differ: {', '.join(differ)}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(baseline=args.baseline, rows=rows,
                                             geomean={str(m): g for m, g in means.items()}),
                                        indent=1))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
