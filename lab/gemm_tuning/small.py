"""The small-M sweep: per weight shape every K split (``kw``) and schedule of the mma.sync
kernel, timed against cuBLAS at each M; the table gets per swept shape its best kw and layout
per row class, and for other shapes the kw rule and layouts with the best geometric-mean
speedup over the swept ones.

Candidates: per NT class, schedules of the register ring (depth, tiles, register cap,
activation stages), groups of kw warps sharing L1, weights through shared-memory stages, and
clusters of blocks sharing a tile group's warps. Schedules that lost every shape at their
rows are not candidates: deeper rings (depth 3+, or 2 with two tiles) at 16-32 rows, 3-4
tiles with weight stages at 32 rows. ``kw`` 1 never won a shape; 16 puts more warps on the
4096-row layers.
"""

from __future__ import annotations

import math

import torch

from gemm_tuning.table_io import merge_small
from gemm_tuning.timing import Layer, measure, nt_class, precompile, speedup
from w12_kernels.gemm import table
from w12_kernels.gemm.small import launcher as small

SWEEP_KW = (2, 4, 8, 16)
# per NT class: (depth, tiles, min_blocks, x_stages) with one group
_ONE_GROUP = {
    1: ((1, 1, 1, 0), (2, 1, 1, 0), (1, 1, 1, 2)),
    2: ((1, 1, 1, 0), (2, 1, 1, 0), (1, 2, 1, 0), (1, 1, 1, 3), (2, 1, 1, 3), (1, 1, 4, 0),
        (1, 1, 2, 0)),
    4: ((1, 1, 1, 0), (2, 1, 1, 0), (1, 1, 3, 0), (1, 2, 1, 0), (1, 3, 1, 0), (1, 2, 2, 0),
        (1, 1, 1, 3), (1, 2, 2, 3), (2, 1, 1, 3)),
    8: ((1, 1, 1, 0), (1, 1, 2, 0), (1, 2, 1, 0), (1, 3, 1, 0), (2, 1, 1, 0), (1, 2, 1, 2),
        (1, 1, 2, 3)),
}
# (depth, tiles, min_blocks, x_stages, groups): groups of kw warps on their own tiles, the
# same columns side by side, so that one group's activation loads are L1 hits for the others
_GROUPED = {
    1: (),
    2: ((1, 1, 1, 0, 2), (1, 1, 1, 0, 4), (2, 1, 1, 0, 2)),
    4: ((1, 1, 1, 0, 2), (1, 2, 1, 0, 2), (1, 1, 1, 0, 4), (1, 1, 2, 0, 2)),
    8: ((1, 1, 1, 0, 2), (1, 2, 1, 0, 2), (1, 1, 1, 0, 4)),
}
# (tiles, min_blocks, x_stages, w_stages): the weights through shared-memory stages instead of
# the register ring (depth 1; activations in registers or in as many stages)
_W_STAGED = {
    1: ((1, 1, 0, 3), (1, 1, 0, 4), (1, 1, 0, 6), (1, 1, 3, 3), (1, 1, 4, 4), (1, 1, 6, 6)),
    2: ((1, 1, 0, 3), (1, 1, 0, 4), (1, 2, 0, 4), (2, 1, 0, 3), (1, 1, 3, 3), (1, 1, 0, 6),
        (1, 2, 0, 3), (1, 2, 3, 3)),
    4: ((1, 2, 0, 4), (2, 2, 0, 3), (2, 2, 0, 4), (1, 3, 0, 3), (2, 3, 3, 3)),
    8: ((1, 1, 0, 3), (2, 1, 0, 3), (1, 2, 0, 3)),
}
# (tiles, min_blocks, cluster): each tile group's kw warps over the blocks of a cluster;
# min_blocks counts the cluster's blocks (of the 8-warp bound over cluster)
_CLUSTERED = {
    1: ((1, 4, 2), (2, 4, 2), (1, 8, 4), (2, 8, 4)),
    2: ((1, 4, 2), (2, 4, 2), (3, 3, 2), (1, 8, 4), (2, 8, 4)),
    4: ((1, 4, 2), (2, 4, 2), (2, 2, 2), (3, 3, 2), (3, 2, 2), (1, 8, 4), (2, 8, 4), (2, 4, 4)),
    8: ((1, 2, 2), (1, 3, 2), (1, 6, 4)),
}
LAYOUT_KEYS = ("depth", "tiles", "min_blocks", "x_stages", "groups", "w_stages", "cluster")
SWEEP_LAYOUTS = {cls: tuple((*lay, 1, 0, 1) for lay in _ONE_GROUP[cls])
                 + tuple((*lay, 0, 1) for lay in _GROUPED[cls])
                 + tuple((1, t, b, xs, 1, ws, 1) for t, b, xs, ws in _W_STAGED[cls])
                 + tuple((1, t, b, 0, 1, 0, c) for t, b, c in _CLUSTERED[cls])
                 for cls in _ONE_GROUP}
SWEEP_RULES = [dict(warps_per_sm=w, min_chunks_per_warp=c, max_kw=8)
               for w in (4, 8, 16, 32, 64, 128) for c in (2, 4, 8)]
# the M a kw is chosen on (1 and 8 bound the NT = 1 class, whose layouts with activations in
# registers run slower at 8 rows than at 1); 64 only picks its layout
SCORED_M = (1, 8, 16, 32)


def layout_dict(layout: tuple) -> dict:
    return dict(zip(LAYOUT_KEYS, layout, strict=True))


def _best_layouts(rows: list[dict], kw_of, points) -> tuple[dict, float]:
    """Per NT class, the schedule with the best summed log speedup when each shape uses
    ``kw_of(n, k)``; returns the schedules and the summed score over ``SCORED_M``."""
    timed = {(r["n"], r["k"], r["m"], r["kw"], *(r[key] for key in LAYOUT_KEYS)): r
             for r in rows}
    by_nt, score = {}, 0.0
    for cls in sorted({nt_class(m) for _, _, m in points}):
        mine = [p for p in points if nt_class(p[2]) == cls]
        options = {lay: sum(speedup(timed.get((n, k, m, kw_of(n, k), *lay)))
                            for n, k, m in mine) for lay in SWEEP_LAYOUTS[cls]}
        lay, _ = max(options.items(), key=lambda kv: kv[1])
        by_nt[str(cls)] = layout_dict(lay)
        score += sum(speedup(timed.get((n, k, m, kw_of(n, k), *lay)))
                     for n, k, m in mine if m in SCORED_M)
    return by_nt, score


def choose_rule(rows: list[dict], sms: int, current: dict,
                keep_kw: bool = False) -> tuple[dict, float]:
    """The small-M part from the sweep's ``rows``: per swept shape its best kw (summed log
    speedup over ``SCORED_M``, each M at its best layout) and layouts; for other shapes the kw
    rule and layouts with the best geometric-mean speedup over the swept ones. NT classes the
    sweep did not time keep the layouts of ``current`` (the table in use). With ``keep_kw``
    (each shape timed at the table's kw only) the kw rule stays and the layouts for other
    shapes are scored at the kw each shape was timed with. A class's warpgroup schedule
    (``wgmma`` step) stays while the shape keeps its kw, and so do the classes the ``power``
    step chose by sustained timing (``sustained``), which a burst sweep does not see."""
    points = sorted({(r["n"], r["k"], r["m"]) for r in rows})
    scored = [p for p in points if p[2] in SCORED_M]
    if keep_kw:
        timed = {(r["n"], r["k"]): r["kw"] for r in rows}
        by_nt, best_score = _best_layouts(rows, lambda n, k: timed[(n, k)], points)
        best = {key: current[key] for key in table.RULE_KEYS}
        best["by_nt"] = by_nt
    else:
        best, best_score = None, -math.inf
        for rule in SWEEP_RULES:
            def kw_of(n, k, rule=rule):
                return table.pick_kw(-(-n // 16), -(-k // 64), sms, **rule)
            by_nt, score = _best_layouts(rows, kw_of, points)
            if best is None or score > best_score:
                best, best_score = dict(rule, by_nt=by_nt), score
    for cls in map(str, table.NT_CLASSES):
        best["by_nt"].setdefault(cls, current["by_nt"].get(cls, table.DEFAULT_SMALL["by_nt"][cls]))
    best["shapes"] = {}
    for n, k in sorted({(p[0], p[1]) for p in points}):
        mine = [p for p in points if p[:2] == (n, k)]
        options = {kw: _best_layouts(rows, lambda *_, kw=kw: kw, mine) for kw in SWEEP_KW}
        kw, (by_nt, score) = max(options.items(), key=lambda kv: kv[1][1])
        if math.isfinite(score):
            best["shapes"][f"{n}x{k}"] = _shape_entry(current.get("shapes", {}).get(f"{n}x{k}", {}),
                                                      kw, by_nt)
    return best, math.exp(best_score / max(1, len(scored)))


def _shape_entry(entry: dict, kw: int, by_nt: dict) -> dict:
    """A swept shape's entry: kw and the swept classes' layouts over the entry it had, whose
    warpgroup schedules and sustained classes stay only at the same kw."""
    same_kw = kw == entry.get("kw")
    kept = {cls: lay if same_kw else {key: v for key, v in lay.items() if key != "wg"}
            for cls, lay in entry.get("by_nt", {}).items()}
    sustained = sorted(c for c in entry.get("sustained", ()) if same_kw and c in kept)
    swept = {cls: ({**lay, "wg": kept[cls]["wg"]} if kept.get(cls, {}).get("wg") else lay)
             for cls, lay in by_nt.items() if cls not in sustained}
    out = dict(kw=kw, by_nt={**kept, **swept})
    if sustained:
        out["sustained"] = sustained
    if same_kw and "one_pass" in entry:
        out["one_pass"] = entry["one_pass"]
    return out


def sweep_candidates(n: int, k: int, m: int, kws) -> list[tuple[str, int, tuple]]:
    """(label, kw, layout) of every schedule the sweep times for an (N, K) weight at M rows
    with each kw of ``kws``."""
    out = []
    for kw in kws:
        if -(-k // 64) // kw < 2:
            continue
        for lay in SWEEP_LAYOUTS[nt_class(m)]:
            depth, tiles, min_blocks, x_stages, groups, w_stages, cluster = lay
            if kw * groups > 32 or kw % cluster:
                continue
            label = (f"kw{kw}_d{depth}_t{tiles}_b{min_blocks}_xs{x_stages}"
                     + (f"_g{groups}" if groups > 1 else "")
                     + (f"_ws{w_stages}" if w_stages else "")
                     + (f"_c{cluster}" if cluster > 1 else ""))
            out.append((label, kw, lay))
    return out


def kernel_of(m: int, kw: int, layout: tuple) -> str:
    """The instantiation ``gemm_small`` compiles for ``m`` rows, ``kw`` and a sweep layout."""
    return small.kernel_name(-(-m // 8), kw=kw, **layout_dict(layout))


def runner(kw: int, layout: tuple):
    def run(x, pw):
        return small.gemm_small(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col,
                                pw.esc_delta, None, pw.n, pw.k, kw=kw, **layout_dict(layout))
    return run


def _compile_one(name: str) -> str:
    small._kernel(0, name)
    return name


def run_sweep(m_values, shapes, current: dict, keep_kw: bool = False,
              workers: int = 0) -> tuple[list[dict], dict]:
    """Time every kw and schedule per shape and M (with ``keep_kw``, only the kw the table in
    use gives the shape, so a sweep of some M classes cannot move the split the others were
    tuned for); return the rows and the small-M part to write. ``workers`` > 0: compile every
    schedule first in that many processes."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def kws_of(n, k):
        return (table.small_config(n, k, sms, current).kw,) if keep_kw else SWEEP_KW

    if workers:
        precompile(_compile_one, [kernel_of(m, kw, lay) for n, k in shapes for m in m_values
                                  for _, kw, lay in sweep_candidates(n, k, m, kws_of(n, k))],
                   workers)
    rows = []
    for n, k in shapes:
        layer = Layer(n, k, seed=n + k)
        for m in m_values:
            runs, meta = {}, {}
            for label, kw, lay in sweep_candidates(n, k, m, kws_of(n, k)):
                runs[label] = runner(kw, lay)
                meta[label] = dict(kw=kw, **layout_dict(lay))
            t_ref, results = measure(layer, m, runs)
            for label, (t, e) in results.items():
                rows.append(dict(n=n, k=k, m=m, **meta[label], us=t, err_ratio=e,
                                 cublas_us=t_ref))
        del layer
        torch.cuda.empty_cache()
    part, mean = choose_rule(rows, sms, current, keep_kw)
    print(f"rule for unswept shapes: geomean x{mean:.3f} on the swept ones", flush=True)
    return rows, part


def partial_update(current_part: dict, swept: dict, every_shape: bool) -> dict:
    """What the step writes: the whole swept part after a sweep of every shape, else only the
    swept shapes' entries over the section's part (``merge_small``)."""
    return swept if every_shape else merge_small(current_part, swept)
