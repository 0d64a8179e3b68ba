"""Large-M W12 GEMM configurations against cuBLAS under sustained load: µs per call, SM clock,
power and energy per call (on the GPU).

At many rows the large-M kernel and cuBLAS both run every multiprocessor at full tensor load,
and on an H100 both then hold the 700 W limit with the SM clock well below its top
(docs/PERF_GEMM.md #89: ~1.4 GHz instead of 1.98), so per-step costs measured with few blocks
busy do not carry over to a full GPU; this gives the clock each configuration actually runs at.
This script replays one CUDA graph per configuration (the calls cycle through weight copies
past the L2, as in ``gemm.py``) back to back for ``--seconds`` while ``nvidia-smi`` samples the
clock and power (``gemm_power.sustained``), and reports, for cuBLAS, the large-M table's entry
(through the launcher) and each ``--configs`` item (``large_probe.py``'s form), µs per call,
the ratio to cuBLAS's sustained time, mean SM MHz, mean W, µJ per call (W x µs) and the
share of samples the driver power-capped, with each configuration's error over cuBLAS's
against float64 (ERR where over the budget of 2).

    python benchmarks/large_power.py --shapes 5120x25600 --m 256,512 \
        --configs "256,2,5,5,1,2;256,2,4,5,4,2"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gemm as G  # noqa: E402
from benchmarks.gemm_power import _fmt, sustained  # noqa: E402
from benchmarks.large_probe import candidate_runs, parse_configs  # noqa: E402


def point_rows(layer, m: int, cands: list, seconds: float, cool: float) -> list[dict]:
    """The sustained rows of one (shape, M): cuBLAS first, then the table and each candidate
    that ``gemm_wgl`` accepts."""
    import torch

    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    runs = candidate_runs(layer, x, cands)
    rows = [dict(label="cublas", err_ratio=1.0,
                 **sustained([lambda i=i: torch.nn.functional.linear(x, layer.bf16[i])
                              for i in order], seconds, cool))]
    for label, run in runs.items():
        row = sustained([lambda i=i, r=run: r(x, layer.w12[i]) for i in order], seconds, cool)
        rows.append(dict(label=label, err_ratio=G.check(layer, m, run), **row))
    for r in rows:
        r.update(n=layer.n, k=layer.k, m=m, ratio=rows[0]["us"] / r["us"])
    return rows


def print_row(r: dict) -> None:
    print(f"{r['n']}x{r['k']} M={r['m']:<5} {r['label']:<36} {r['us']:9.2f} us (x{r['ratio']:.3f})"
          f"  {_fmt(r['sm_mhz'], '5.0f')} MHz  {_fmt(r['watts'], '4.0f')} W"
          f"  {_fmt(r['uj'], '8.0f')} uJ/call"
          + ("" if r.get("power_capped") is None
             else f"  capped {100 * r['power_capped']:.0f}%")
          + ("" if r["err_ratio"] <= 2 else f"  ERR x{r['err_ratio']:.1f}"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", required=True, help="NxK,...")
    parser.add_argument("--m", default="512", help="activation rows (> 64), comma-separated")
    parser.add_argument("--configs", default="",
                        help="';'-separated candidates, each comma-separated integers "
                             "(large_probe.py's form); none: cuBLAS and the table only")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--cool", type=float, default=1.0, help="idle seconds before each")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cands = parse_configs(args.configs) if args.configs.strip() else []
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    m_values = [int(v) for v in args.m.split(",")]
    if min(m_values) <= 64:
        raise SystemExit("large_power: --m takes rows above 64 (the large-M path)")
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        raise SystemExit("large_power: needs a compute-capability 9.0 GPU and CuPy")
    rows = []
    for n, k in shapes:
        layer = G.Layer(n, k, seed=n + k)
        for m in m_values:
            for r in point_rows(layer, m, cands, args.seconds, args.cool):
                print_row(r)
                rows.append(r)
        del layer
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
