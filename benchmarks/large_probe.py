"""Warpgroup-MMA configurations of the large-M kernel that the sweep does not list, timed against
the large-M table's entry (through the launcher) and cuBLAS in the same CUDA graphs (on the GPU).

Each ``--configs`` item is a candidate in ``gemm.py``'s ``WGMMA_CANDIDATES`` form: values in the
order of ``WGMMA_KEYS`` (block_m, warpgroups, x_stages, w_stages, splits, a_regs, persist, tail,
mcast, xorder, wreuse, l2hint), the trailing ones 0 where left out. A configuration
``gemm_wgl`` refuses is reported and skipped; the rest print in one line, fastest first, with
the speedup over cuBLAS (and ERR where the error is over twice cuBLAS's), as the sweep prints
its points.

    python benchmarks/large_probe.py --shape 5120x25600 --m 512 \
        --configs "256,2,5,5,1,2,1;128,2,6,6,1,2,1,0,0,0,1"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gemm as G  # noqa: E402


def parse_configs(text: str) -> list[tuple]:
    """``"a,b,...;c,d,..."`` as ``("wgmma", a, b, ...)`` candidates (6 to 11 integers each)."""
    cands = []
    for item in filter(None, (s.strip() for s in text.split(";"))):
        try:
            values = tuple(int(v) for v in item.split(","))
        except ValueError:
            raise SystemExit(f"large_probe: {item!r}: not comma-separated integers") from None
        if not 6 <= len(values) <= len(G.WGMMA_KEYS):
            raise SystemExit(f"large_probe: {item!r}: {len(values)} values; give 6 to "
                             f"{len(G.WGMMA_KEYS)} ({', '.join(G.WGMMA_KEYS)})")
        cands.append(("wgmma", *values))
    if not cands:
        raise SystemExit("large_probe: --configs is empty")
    return cands


def candidate_runs(layer, x, cands: list) -> dict:
    """The large-M table's entry (through the launcher) and each candidate that ``gemm_wgl``
    accepts for ``x`` on ``layer``, by label (refused ones are reported and left out)."""
    import torch

    runs = {"table": G.default_run}
    for cand in cands:
        run = G._large_runner(cand)
        try:
            run(x, layer.w12[0])
            torch.cuda.synchronize()
        except ValueError as e:  # (gemm_wgl's refusal of a configuration)
            print(f"skipped {G._large_label(cand)}: {e}", flush=True)
            continue
        runs[G._large_label(cand)] = run
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, help="NxK")
    parser.add_argument("--m", type=int, required=True, help="activation rows (> 64)")
    parser.add_argument("--configs", required=True,
                        help="';'-separated candidates, each comma-separated integers")
    args = parser.parse_args()
    cands = parse_configs(args.configs)
    n, k = (int(v) for v in args.shape.split("x"))
    import torch

    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        raise SystemExit("large_probe: needs a compute-capability 9.0 GPU and CuPy")
    layer = G.Layer(n, k, seed=n + k)
    x = torch.randn(args.m, k, device="cuda").to(torch.bfloat16)
    G._measure(layer, args.m, candidate_runs(layer, x, cands))


if __name__ == "__main__":
    main()
