"""Tune the W12 GEMM's launch table on this GPU: the one tool that writes
``w12_kernels/gemm/tuned.json`` (through ``gemm_tuning.table_io.write_table``).

    python lab/tune_gemm.py small --m 1,8,16,32,64 [--shapes NxK,...] [--keep-kw] --write
    python lab/tune_gemm.py wgmma --m 24,32,48,64 --write   # Hopper: warpgroup small-M kernel
    python lab/tune_gemm.py wgmma --m 65,128 --write        # ... one pass for 65..128 rows
    python lab/tune_gemm.py large --m 128,256,512,1024,2048 --write [--candidates wgmma_m256]
    python lab/tune_gemm.py toggle --option l2hint --m 512 --rounds 2 --write --section exact
    python lab/tune_gemm.py power --shapes 10240x5120 --m 32 --write

Each step times its candidates against cuBLAS on this GPU (``benchmarks/harness.py``'s method)
and prints what it measured; with ``--write`` it merges its choices into the section of this
GPU's architecture and multiprocessor count (``--section exact``: of its memory class too,
entries only that kind of GPU reads). ``--json`` keeps the rows. docs/KERNELS.md describes the
table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gemm_tuning import large, power, small, table_io, toggle, wgmma  # noqa: E402
from gemm_tuning.timing import Layer, nt_class, parse_shapes  # noqa: E402

from w12_kernels.gemm import table  # noqa: E402
from w12_kernels.gemm.large import launcher as large_launcher  # noqa: E402


def _ms(text: str, low: int, high: int) -> list[int]:
    try:
        ms = [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"tune_gemm: bad --m {text!r}") from None
    if not all(low <= m <= high for m in ms):
        raise SystemExit(f"tune_gemm: this step takes M in {low}..{high}, got {text}")
    return ms


def _write(args, part: str, value: dict) -> None:
    name = table_io.section_key(args.section)
    table_io.write_table(name, part, value, torch.cuda.get_device_name())
    print(f"wrote the {part} part of section {name} of {table.TUNED_PATH}", flush=True)


def _section_part(args, part: str) -> dict:
    return table_io.read_section(table_io.section_key(args.section)).get(part, {})


def step_small(args) -> list[dict]:
    shapes = parse_shapes(args.shapes)
    current = table.small_rule(table.gpu_key())
    rows, swept = small.run_sweep(_ms(args.m, 1, table.SMALL_M_MAX), shapes, current,
                                  args.keep_kw, args.compile_workers)
    if args.write:
        every = not args.shapes
        _write(args, "small_m", small.partial_update(_section_part(args, "small_m"), swept,
                                                     every))
    return rows


def step_wgmma(args) -> list[dict]:
    if not wgmma.wgmma.available():
        raise SystemExit("tune_gemm: the wgmma step needs a compute-capability 9.0 GPU and CuPy")
    torch.manual_seed(0)
    rows = []
    for n, k in parse_shapes(args.shapes):
        layer = Layer(n, k, seed=n + k)
        for m in _ms(args.m, 9, 2 * table.SMALL_M_MAX):
            rows.append(wgmma.probe(layer, m))
            r = rows[-1]
            wg = {lbl: v for lbl, v in r["us"].items() if lbl.startswith("wg_")}
            best = min((v, lbl) for lbl, v in wg.items()) if wg else (float("nan"), "-")
            print(f"{n:>6}x{k:<5} M={m:<3} kw={r['kw']:<2} cublas {r['us']['cublas']:7.1f} us "
                  f"mma.sync {r['us']['mma_sync']:7.1f}  best {best[1]} {best[0]:7.1f}  "
                  f"failed {list(r['failed'])}", flush=True)
        del layer
        torch.cuda.empty_cache()
    wgmma.report(rows)
    if args.write:
        _write(args, "small_m", wgmma.apply_choices(_section_part(args, "small_m"),
                                                    wgmma.choose(rows)))
    return rows


def step_large(args) -> list[dict]:
    rule = table.large_rule(table.gpu_key())
    rows, swept = large.run_sweep(_ms(args.m, table.SMALL_M_MAX + 1, 1 << 20),
                                  parse_shapes(args.shapes), rule, args.candidates,
                                  args.keep_margin / 100)
    if args.write:
        every = not args.shapes and not args.candidates
        _write(args, "large", table_io.merge_large(_section_part(args, "large"), swept,
                                                   keep_default=not every))
    return rows


def step_toggle(args) -> list[dict]:
    if not large_launcher.available():
        raise SystemExit("tune_gemm: the toggle step needs a compute-capability 9.0 GPU and CuPy")
    (m,) = _ms(args.m, table.SMALL_M_MAX + 1, 1 << 20)
    rule = table.large_rule(table.gpu_key())
    out, writes, differ = [], {}, []
    opt = args.option
    for n, k in parse_shapes(args.shapes):
        cfg = table.large_config(n, k, m, rule)
        if cfg is None:
            print(f"{n}x{k} | the table's choice at {m} rows is decode + cuBLAS: skipped")
            continue
        times, same = toggle.time_shape(n, k, m, cfg, opt, args.rounds)
        torch.cuda.empty_cache()
        if not same:
            differ.append(f"{n}x{k}")
        for off, on, ref in times:
            print(f"{n}x{k} | {opt} off {off:.2f} us | on {on:.2f} us | on/off {on / off:.3f} "
                  f"| cublas {ref:.2f} us | {'ok' if same else 'BITS DIFFER OR OVER BUDGET'}",
                  flush=True)
        row = dict(n=n, k=k, m=m, times=times, same=same)
        found = toggle.table_entry(n, k, m, rule)
        change = (toggle.table_change(found[1], opt, times, args.margin / 100)
                  if same and found is not None else None)
        if change is not None:
            writes.setdefault(f"{n}x{k}", {})[found[0]] = change
            row["written"] = change
        out.append(row)
    if args.write:
        _write(args, "large", table_io.merge_large(_section_part(args, "large"),
                                                   {"shapes": writes}))
    if differ:
        raise SystemExit(f"tune_gemm: the bits differ or are over budget on {', '.join(differ)}")
    return out


def step_power(args) -> list[dict]:
    shapes = parse_shapes(args.shapes or power.DEFAULT_SHAPES)
    ms = _ms(args.m, 1, table.SMALL_M_MAX)
    if args.write and len({nt_class(m) for m in ms}) != len(ms):
        raise SystemExit("tune_gemm: power --write takes one M per row class (1-8, 9-16, "
                         "17-32, 33-64): a class has one schedule")
    rows = []
    for n, k in shapes:
        layer = Layer(n, k, seed=0)
        for m in ms:
            rows += power.shape_rows(layer, m, args.candidates, args.seconds, args.cool)
        del layer
        torch.cuda.empty_cache()
    if args.write:
        _write(args, "small_m", power.apply_choices(_section_part(args, "small_m"),
                                                    power.choose(rows, args.margin)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--shapes", default=None, help="NxK,... (default: every layer shape "
                                                       "of the benchmark's models)")
    common.add_argument("--write", action="store_true", help="merge the choices into the table")
    common.add_argument("--section", default="base", choices=("base", "exact"),
                        help="the section written: this GPU's architecture and multiprocessor "
                             "count (base) or also its memory class (exact)")
    common.add_argument("--json", type=Path, default=None, help="write the rows here")
    p = sub.add_parser("small", parents=[common], help="the small-M sweep (kw and layouts)")
    p.add_argument("--m", default="1,8,16,32,64")
    p.add_argument("--keep-kw", action="store_true", help="time only the table's kw per shape")
    p.add_argument("--compile-workers", type=int, default=8,
                   help="processes compiling the schedules first (0: each when first timed)")
    p = sub.add_parser("wgmma", parents=[common], help="the warpgroup small-M kernel's choices")
    p.add_argument("--m", default="24,32,48,64")
    p = sub.add_parser("large", parents=[common], help="the large-M sweep")
    p.add_argument("--m", default="128,256,512,1024,2048")
    p.add_argument("--candidates", default=None,
                   help="only the choices whose label holds one of these comma-separated parts "
                        "(decode + cuBLAS and each point's current entry are always timed)")
    p.add_argument("--keep-margin", type=float, default=2.0,
                   help="percent a choice must beat a point's current entry by (default 2)")
    p = sub.add_parser("toggle", parents=[common], help="A/B of one per-entry option")
    p.add_argument("--option", required=True, choices=toggle.OPTIONS)
    p.add_argument("--m", default="256")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--margin", type=float, default=1.0,
                   help="percent by which one side must win each round (default 1)")
    p = sub.add_parser("power", parents=[common], help="the small-M schedules, sustained load")
    p.add_argument("--m", default="32")
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--cool", type=float, default=1.0)
    p.add_argument("--margin", type=float, default=0.01,
                   help="how much faster than the table's schedule a winner must be (fraction)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tune_gemm: needs a CUDA GPU")
    torch.manual_seed(0)
    step = {"small": step_small, "wgmma": step_wgmma, "large": step_large,
            "toggle": step_toggle, "power": step_power}[args.step]
    rows = step(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
