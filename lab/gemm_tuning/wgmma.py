"""The warpgroup-MMA small-M kernel's step: per shape and M, its schedules (stages,
warpgroups, row groups per block, blocks per row range) with the table's K split, checked bit
for bit against the mma.sync kernel and against each row computed alone, and timed against
cuBLAS, the mma.sync kernel and ``w12_linear`` in alternating rounds. A schedule goes into the
shape's layout of a row class (``wg``) where its worst time over the class's measured M is at
most ``MARGIN`` of the mma.sync kernel's; above 64 rows, into the shape's ``one_pass`` where one
pass of 128-row blocks beats the two passes of at most 64 rows (the same bits).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from gemm_tuning.timing import Layer, nt_class, table_run, time_graphs
from w12_kernels.gemm import dispatch, table
from w12_kernels.gemm.cuda import runtime
from w12_kernels.gemm.small import launcher as small
from w12_kernels.gemm.wgmma import launcher as wgmma

ONE_PASS = "one_pass"  # the class of 65..128 rows: one pass of 128-row blocks
MARGIN = 0.97  # a warpgroup schedule is chosen when it takes at most 97% of mma.sync's time


def row_class(m: int):
    return ONE_PASS if m > table.SMALL_M_MAX else nt_class(m)


def schedules(kw: int, n_block: int = 16) -> list[tuple[int, int, int, int]]:
    """(depth, warpgroups, row groups, split) schedules of the kernel for this kw with at most
    two accumulator sets per warpgroup (four cost registers that spill or serialize the MMAs),
    4 stages (8 with one warpgroup of one row group), and with ``n_block`` rows a block within
    the shared memory a block may have."""
    out = []
    limit = runtime.shared_memory_limit(torch.cuda.current_device())
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


def _mma_sync(cfg: table.SmallConfig, m: int):
    """The mma.sync kernel with the table's layout for ``m`` rows; above 64 rows the
    dispatch's passes of at most 64 (what runs without a one-pass entry)."""
    if m > table.SMALL_M_MAX:
        two = replace(cfg, one_pass=None)
        return lambda x, pw: dispatch._small_passes(x, pw.chunks, pw.scale, pw.esc_rowptr,
                                                    pw.esc_col, pw.esc_delta, None, pw.n, pw.k,
                                                    two)
    lay = cfg.layout(m)
    return lambda x, pw: small.gemm_small(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col,
                                          pw.esc_delta, None, pw.n, pw.k, kw=cfg.kw,
                                          **lay.schedule())


def probe(layer: Layer, m: int) -> dict:
    """One (shape, M): every schedule's bits, error and time, with the references'."""
    pw0 = layer.w12[0]
    cfg = dispatch.small_config(pw0.n, pw0.k, torch.device("cuda"))
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    runs = {"cublas": lambda x, pw, i: torch.nn.functional.linear(x, layer.bf16[i]),
            "mma_sync": (lambda run: lambda x, pw, i: run(x, pw))(_mma_sync(cfg, m)),
            "w12_linear": lambda x, pw, i: table_run(x, pw)}
    n_block = dispatch.ONE_PASS_ROWS if m > table.SMALL_M_MAX else None
    for depth, wgs, rg, split in schedules(cfg.kw, n_block or 16):
        run = _wg(cfg.kw, depth, wgs, rg, split, n_block)
        runs[f"wg_d{depth}_g{wgs}_r{rg}_s{split}"] = lambda x, pw, i, run=run: run(x, pw)
    ok, failed = {}, {}
    for lbl, run in runs.items():
        try:
            run(x, pw0, 0)
            torch.cuda.synchronize()
            ok[lbl] = run
        except Exception as exc:  # reported, the others timed
            failed[lbl] = f"{type(exc).__name__}: {str(exc)[:300]}"
    ref = x.double() @ layer.bf16[0].double().T
    err_bf16 = float((ok["cublas"](x, pw0, 0).double() - ref).norm() / ref.norm())
    mma = ok["mma_sync"](x, pw0, 0).view(torch.int16)
    alone = torch.cat([table_run(x[r : r + 1], pw0) for r in range(m)]).view(torch.int16)
    row = {"n": layer.n, "k": layer.k, "m": m, "kw": cfg.kw, "failed": failed, "err_ratio": {},
           "bits_equal_small": {}, "bits_equal_alone": {},
           "small_equal_alone": bool(torch.equal(mma, alone))}
    for lbl, run in ok.items():
        out = run(x, pw0, 0)
        row["err_ratio"][lbl] = float((out.double() - ref).norm() / ref.norm()) / err_bf16
        if lbl.startswith("wg_"):
            bits = out.view(torch.int16)
            row["bits_equal_small"][lbl] = bool(torch.equal(bits, mma))
            row["bits_equal_alone"][lbl] = bool(torch.equal(bits, alone))
    times = time_graphs([[lambda i=i, r=run: r(x, layer.w12[i], i) for i in order]
                         for run in ok.values()])
    row["us"] = dict(zip(ok, times, strict=True))
    return row


def choose(rows: list[dict]) -> dict[tuple[int, int, int | str], list[int] | None]:
    """Per (N, K, NT class or ``one_pass``) measured: the warpgroup schedule whose worst time
    ratio to the mma.sync kernel (above 64 rows: the two passes) over the class's measured M is
    lowest, if at most ``MARGIN``, else None. Only schedules with the mma.sync kernel's bits at
    every M of the class count."""
    out = {}
    keys = sorted({(r["n"], r["k"], row_class(r["m"])) for r in rows}, key=str)
    for n, k, cls in keys:
        mine = [r for r in rows if (r["n"], r["k"], row_class(r["m"])) == (n, k, cls)]
        labels = {lbl for lbl in mine[0]["us"] if lbl.startswith("wg_")
                  and all(r["bits_equal_small"].get(lbl) for r in mine)}
        worst = {lbl: max(r["us"][lbl] / r["us"]["mma_sync"] for r in mine) for lbl in labels}
        best = min(worst, key=worst.get) if worst else None
        out[(n, k, cls)] = (None if best is None or worst[best] > MARGIN
                            else [int(v[1:]) for v in best.split("_")[1:]])
    return out


def apply_choices(part: dict, choices: dict) -> dict:
    """The small-M part with the choices in the shapes' entries (``by_nt[class]["wg"]``, and
    for 65..128 rows ``one_pass``); classes measured without a winner lose theirs. Shapes
    without an entry of their own (a kw and layouts from the small-M sweep) are left out."""
    shapes = {shape: dict(e) for shape, e in part.get("shapes", {}).items()}
    for (n, k, cls), wg in choices.items():
        entry = shapes.get(f"{n}x{k}")
        if entry is None:
            continue
        if cls == ONE_PASS:
            entry.pop(ONE_PASS, None)
            if wg is not None:
                entry[ONE_PASS] = wg
            continue
        by_nt = dict(entry.get("by_nt", {}))
        fallback = part.get("by_nt", {}).get(str(cls), table.DEFAULT_SMALL["by_nt"][str(cls)])
        lay = dict(by_nt.get(str(cls), fallback))
        lay.pop("wg", None)
        if wg is not None:
            lay["wg"] = wg
        by_nt[str(cls)] = lay
        entry["by_nt"] = by_nt
    return {**part, "shapes": shapes}


def report(rows: list[dict]) -> None:
    """Per M, the geometric-mean speedup over cuBLAS of the mma.sync kernel, of the best
    warpgroup schedule, of the better of the two and of ``w12_linear`` (the table in use)."""
    def geo(values) -> float:
        values = list(values)
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan

    for m in sorted({r["m"] for r in rows}):
        sel = [r for r in rows if r["m"] == m and any(lbl.startswith("wg_") for lbl in r["us"])]
        if not sel:
            continue
        best = [min(v for lbl, v in r["us"].items() if lbl.startswith("wg_")) for r in sel]
        pairs = list(zip(sel, best, strict=True))
        print(f"M={m:<3} {len(sel)} shapes: mma.sync "
              f"x{geo(r['us']['cublas'] / r['us']['mma_sync'] for r in sel):.3f}  best warpgroup "
              f"x{geo(r['us']['cublas'] / b for r, b in pairs):.3f}  better of the two "
              f"x{geo(r['us']['cublas'] / min(b, r['us']['mma_sync']) for r, b in pairs):.3f}  "
              f"w12_linear x{geo(r['us']['cublas'] / r['us']['w12_linear'] for r in sel):.3f}",
              flush=True)
