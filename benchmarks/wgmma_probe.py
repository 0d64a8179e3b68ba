"""Probe of the warpgroup-MMA small-M W12 GEMM (``w12_kernels/gemm/wgmma.py``) on an H200.

For every distinct layer shape of the benchmark's models and each M it checks the kernel's bits
against the mma.sync small-M kernel at the same M and against each row computed alone by
``w12_linear`` (batch invariance), its error against float64 on the exact weights, and times it
against cuBLAS, the mma.sync kernel and ``w12_linear`` in alternating rounds (``time_graphs``),
for several schedules (stages, warpgroups, row groups per block, blocks per row range) with the
production K split. One line per (shape, M); last, per M, the geometric-mean speedup over
cuBLAS of the mma.sync kernel (the table's layout), of the best warpgroup schedule, of the
better of the two per shape, and of ``w12_linear`` with the table in use. JSON with ``--json``.
``--write-table`` puts, per shape and class of M measured, the warpgroup schedule into
``tuned.json`` where its worst time over the class's measured M is at most 97% of the mma.sync
kernel's (``Layout.wg``), and takes it out where none is. At 65..128 rows the kernel runs
128-row blocks, one pass over the weight, against the launcher's two passes of at most 64 rows
(the same bits); a winner goes into the shape's ``one_pass``.

    python benchmarks/wgmma_probe.py --m 24,32,48,64 --json out/wgmma_probe.json --write-table
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm import (  # noqa: E402
    LAYOUT_KEYS,
    SWEEP_SHAPES,
    Layer,
    _nt_class,
    _small_runner,
    default_run,
    time_graphs,
)
from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import cuda, launcher, wgmma  # noqa: E402

M_VALUES = [16, 32]


ONE_PASS = "one_pass"  # the class of 65..128 rows: one pass of 128-row blocks


def _class(m: int):
    return ONE_PASS if m > cfgs.SMALL_M_MAX else _nt_class(m)


def schedules(kw: int, n_block: int = 16) -> list[tuple[int, int, int, int]]:
    """(depth, warpgroups, row groups, split) schedules of the kernel for this kw with at most
    two accumulator sets per warpgroup (four cost registers that spill or serialize the
    MMAs), 4 stages (8 with one warpgroup of one row group), and with ``n_block`` rows a
    block within the shared memory a block may have."""
    out = []
    limit = cuda.shared_memory_limit(torch.cuda.current_device())
    for wgs in (1, 2):
        for rg in wgmma.ROW_GROUPS:
            for split in wgmma.SPLITS:
                for depth in (4, 8) if wgs * rg == 1 else (4,):
                    try:
                        sets = wgmma.check(kw, depth, n_block, wgs, rg, split)
                    except ValueError:
                        continue
                    if sets <= 2 and wgmma.shared_bytes(n_block, wgs, depth, rg) <= limit:
                        out.append((depth, wgs, rg, split))
    return out


def _wg(kw: int, depth: int, wgs: int, rg: int, split: int, n_block: int | None = None):
    def run(x, pw):
        return wgmma.gemm_wg(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta,
                             None, pw.n, pw.k, kw=kw, depth=depth, n_block=n_block,
                             warpgroups=wgs, row_groups=rg, split=split)
    return run


def _mma_sync(cfg: cfgs.SmallConfig, m: int):
    """The mma.sync kernel with the table's layout for ``m`` rows (whatever the table routes);
    above 64 rows the launcher's passes of at most 64 (what runs without a one-pass entry)."""
    if m > cfgs.SMALL_M_MAX:
        two = replace(cfg, one_pass=None)
        return lambda x, pw, i: launcher._small_passes(x, pw.chunks, pw.scale, pw.esc_rowptr,
                                                       pw.esc_col, pw.esc_delta, None, pw.n,
                                                       pw.k, two)
    run = _small_runner(cfg.kw, tuple(getattr(cfg.layout(m), key) for key in LAYOUT_KEYS))
    return lambda x, pw, i: run(x, pw)


def probe(layer: Layer, m: int) -> dict:
    pw0 = layer.w12[0]
    cfg = launcher.small_config(pw0.n, pw0.k, torch.device("cuda"))
    kw = cfg.kw
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    runs = {"cublas": lambda x, pw, i: torch.nn.functional.linear(x, layer.bf16[i]),
            "mma_sync": _mma_sync(cfg, m),
            "w12_linear": lambda x, pw, i: default_run(x, pw)}
    n_block = launcher.ONE_PASS_ROWS if m > cfgs.SMALL_M_MAX else None
    for depth, wgs, rg, split in schedules(kw, n_block or 16):
        run = _wg(kw, depth, wgs, rg, split, n_block)
        runs[f"wg_d{depth}_g{wgs}_r{rg}_s{split}"] = lambda x, pw, i, run=run: run(x, pw)
    ok, failed = {}, {}
    for label, run in runs.items():
        try:
            run(x, pw0, 0)
            torch.cuda.synchronize()
            ok[label] = run
        except Exception as exc:  # report it, time the others
            failed[label] = f"{type(exc).__name__}: {str(exc)[:300]}"
    ref = x.double() @ layer.bf16[0].double().T
    err_bf16 = float((ok["cublas"](x, pw0, 0).double() - ref).norm() / ref.norm())
    small = ok["mma_sync"](x, pw0, 0).view(torch.int16)
    alone = torch.cat([default_run(x[r : r + 1], pw0) for r in range(m)]).view(torch.int16)
    row = {"n": layer.n, "k": layer.k, "m": m, "kw": kw, "failed": failed, "us": {},
           "err_ratio": {}, "bits_equal_small": {}, "bits_equal_alone": {},
           "small_equal_alone": bool(torch.equal(small, alone)),
           "w12_linear_equal_small": bool(torch.equal(default_run(x, pw0).view(torch.int16),
                                                      small))}
    for label, run in ok.items():
        out = run(x, pw0, 0)
        row["err_ratio"][label] = float((out.double() - ref).norm() / ref.norm()) / err_bf16
        if label.startswith("wg_"):
            bits = out.view(torch.int16)
            row["bits_equal_small"][label] = bool(torch.equal(bits, small))
            row["bits_equal_alone"][label] = bool(torch.equal(bits, alone))
            row["rerun_equal"] = row.get("rerun_equal", True) and bool(
                torch.equal(run(x, pw0, 0).view(torch.int16), bits))
    times = time_graphs([[lambda i=i, r=run: r(x, layer.w12[i], i) for i in order]
                         for run in ok.values()])
    row["us"] = dict(zip(ok, times, strict=True))
    return row


MARGIN = 0.97  # a warpgroup schedule is chosen when it takes at most 97% of mma.sync's time


def choose(rows: list[dict]) -> dict[tuple[int, int, int | str], list[int] | None]:
    """Per (N, K, NT class or ``one_pass``) measured: the warpgroup schedule whose worst time
    ratio to the mma.sync kernel (above 64 rows: the two passes) over the class's measured M is
    lowest, if at most ``MARGIN``, else None."""
    out = {}
    keys = sorted({(r["n"], r["k"], _class(r["m"])) for r in rows}, key=str)
    for n, k, cls in keys:
        mine = [r for r in rows if (r["n"], r["k"], _class(r["m"])) == (n, k, cls)]
        # schedules timed at every M of the class, with the mma.sync kernel's bits at each
        labels = {lbl for lbl in mine[0]["us"] if lbl.startswith("wg_")
                  and all(r["bits_equal_small"].get(lbl) for r in mine)}
        worst = {lbl: max(r["us"][lbl] / r["us"]["mma_sync"] for r in mine) for lbl in labels}
        best = min(worst, key=worst.get) if worst else None
        out[(n, k, cls)] = (None if best is None or worst[best] > MARGIN
                            else [int(v[1:]) for v in best.split("_")[1:]])
    return out


def write_table(rows: list[dict]) -> None:
    """The choices into the small-M entries of ``tuned.json`` (``by_nt[class]["wg"]``, and for
    65..128 rows ``one_pass``: stages, warpgroups, row groups, split); classes measured without
    a winner lose theirs."""
    table = json.loads(cfgs.TUNED_PATH.read_text())
    shapes = table["small_m"].setdefault("shapes", {})
    for (n, k, cls), wg in choose(rows).items():
        entry = shapes.get(f"{n}x{k}")
        if entry is None:
            continue  # only shapes the sweep gave an entry (kw and layouts)
        if cls == ONE_PASS:
            entry.pop(ONE_PASS, None)
            if wg is not None:
                entry[ONE_PASS] = wg
            print(f"{n}x{k} 65..128 rows: {'one pass ' + str(wg) if wg else 'two passes'}")
            continue
        by_nt = entry.setdefault("by_nt", {})
        lay = dict(by_nt.get(str(cls), table["small_m"]["by_nt"][str(cls)]))
        lay.pop("wg", None)
        if wg is not None:
            lay["wg"] = wg
        by_nt[str(cls)] = lay
        print(f"{n}x{k} NT class {cls}: {'warpgroup ' + str(wg) if wg else 'mma.sync'}")
    cfgs.TUNED_PATH.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote w12_kernels/gemm/{cfgs.TUNED_PATH.name}")


def _geo(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--shapes", help="NxK,NxK,... (default: every shape of the models)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--write-table", action="store_true",
                        help="write the choices into w12_kernels/gemm/tuned.json")
    args = parser.parse_args()
    if not wgmma.available():
        sys.exit("needs a compute-capability 9.0 GPU and CuPy")
    torch.manual_seed(0)
    todo = ([tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes
            else SWEEP_SHAPES)
    rows = []
    for n, k in todo:
        layer = Layer(n, k, seed=n + k)
        for m in map(int, args.m.split(",")):
            r = probe(layer, m)
            rows.append(r)
            t = r["us"]
            wg = {lbl: v for lbl, v in t.items() if lbl.startswith("wg_")}
            best = min((v, lbl) for lbl, v in wg.items()) if wg else (math.nan, "-")
            bad = [lbl for lbl in wg if not (r["bits_equal_small"][lbl]
                                             and r["bits_equal_alone"][lbl])]
            print(f"{n:>6}x{k:<5} M={m:<3} kw={r['kw']:<2} cublas {t['cublas']:7.1f} us  "
                  f"mma.sync {t['mma_sync']:7.1f} (x{t['cublas'] / t['mma_sync']:.3f})  "
                  f"w12_linear {t['w12_linear']:7.1f}  "
                  f"wg {best[1]:<15} {best[0]:7.1f} (x{t['cublas'] / best[0]:.3f})  "
                  f"err/cublas {max(r['err_ratio'].values()):.3f}  bits differ: {bad or 'none'}"
                  f"  rerun equal {r.get('rerun_equal')}  failed {list(r['failed'])}",
                  flush=True)
        del layer
        torch.cuda.empty_cache()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    print("geometric-mean speedup over cuBLAS (shapes where the warpgroup kernel ran):")
    for m in sorted({r["m"] for r in rows}):
        sel = [r for r in rows if r["m"] == m and any(lbl.startswith("wg_") for lbl in r["us"])]
        if not sel:
            continue
        prod = _geo(r["us"]["cublas"] / r["us"]["mma_sync"] for r in sel)
        linear = _geo(r["us"]["cublas"] / r["us"]["w12_linear"] for r in sel)
        best_wg = [min(v for lbl, v in r["us"].items() if lbl.startswith("wg_")) for r in sel]
        wg = _geo(r["us"]["cublas"] / b for r, b in zip(sel, best_wg, strict=True))
        both = _geo(r["us"]["cublas"] / min(b, r["us"]["mma_sync"])
                    for r, b in zip(sel, best_wg, strict=True))
        worst = min(r["us"]["cublas"] / min(b, r["us"]["mma_sync"])
                    for r, b in zip(sel, best_wg, strict=True))
        print(f"M={m:<3} {len(sel)} shapes: mma.sync x{prod:.3f}  best warpgroup schedule "
              f"x{wg:.3f}  better of the two x{both:.3f} (worst shape x{worst:.3f})  "
              f"w12_linear (the table in use) x{linear:.3f}")
    if args.write_table:
        write_table(rows)


if __name__ == "__main__":
    main()
