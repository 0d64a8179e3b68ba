"""The large-M sweep: per weight shape and M (above 64 rows) decode + cuBLAS and every
candidate configuration of the warpgroup-MMA kernel, timed against cuBLAS; the table gets per
(shape, M class) the fastest within the error budget, a point's current entry staying unless
a candidate beat it by more than a margin (the run-to-run noise reorders close ones).

Candidates (``WglConfig``): 256 activation rows with a producer warpgroup (the most entries),
128 rows with the decoded weights in registers and a producer warp, one MMA warpgroup of 64
rows (half the K split a block) and two on the same 64 rows; K in 2-3 ranges (clusters),
stream-K, a tail launch for the partial last wave (2-4 ranges or stream-K), and the three
per-entry options: activations straight from x (``xorder``), a tile block's token blocks
together (``wreuse``), L2 eviction hints (``l2hint``). cuBLAS's own tiling of the one-wave
layers (128 weight rows x 64 tokens, the whole K) reached only 0.33-0.52x at 256 rows: not a
candidate.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from gemm_tuning.timing import Layer, measure, speedup, table_run
from w12_kernels.gemm import dispatch, table
from w12_kernels.gemm.large import launcher as large
from w12_kernels.gemm.large.launcher import WglConfig


def _c(block_m, warpgroups, x_stages, w_stages, splits, a_regs, persist=0, tail=0, xorder=0,
       wreuse=0, l2hint=0) -> WglConfig:
    return WglConfig(block_m, warpgroups, x_stages, w_stages, splits, a_regs, bool(persist),
                     tail, bool(xorder), bool(wreuse), bool(l2hint))


CANDIDATES = (
    # the decoded weights in registers, a producer warp
    _c(128, 2, 4, 8, 1, 1), _c(128, 2, 4, 8, 2, 1), _c(128, 2, 6, 8, 2, 1),
    _c(128, 2, 8, 8, 2, 1),
    # a producer warpgroup that gives its registers away
    _c(256, 2, 4, 6, 1, 2), _c(256, 2, 4, 6, 2, 2), _c(256, 2, 4, 5, 4, 2),
    _c(256, 2, 5, 5, 1, 2), _c(256, 2, 5, 5, 2, 2),
    # K in three ranges, clusters of 3: a 4096-row layer's blocks fit one wave
    _c(256, 2, 5, 5, 3, 2), _c(128, 2, 8, 8, 3, 1),
    # stream-K
    _c(256, 2, 5, 5, 1, 2, 1), _c(256, 2, 4, 6, 1, 2, 1),
    # one MMA warpgroup of 64 weight rows: twice the blocks of the same activation rows
    _c(256, 1, 5, 8, 1, 1), _c(256, 1, 5, 8, 2, 1), _c(128, 1, 6, 12, 2, 1),
    _c(128, 1, 4, 5, 1, 1), _c(128, 1, 4, 5, 2, 1),
    # whole waves with one K range, the tile blocks past them in a second launch
    _c(256, 2, 5, 5, 1, 2, 0, 2), _c(256, 2, 5, 5, 1, 2, 0, 3), _c(256, 2, 5, 5, 1, 2, 0, 4),
    _c(256, 2, 4, 6, 1, 2, 0, 2), _c(256, 2, 5, 5, 1, 2, 0, 1), _c(256, 2, 4, 6, 1, 2, 0, 1),
    # two MMA warpgroups on one group of 64 weight rows, every other column each
    _c(256, 1, 5, 8, 1, 3), _c(256, 1, 5, 8, 2, 3), _c(256, 1, 5, 8, 3, 3),
    _c(256, 1, 5, 6, 2, 3),
    # the activations straight from x, no image pass
    _c(256, 2, 5, 5, 2, 2, 0, 0, 1), _c(256, 1, 5, 8, 2, 3, 0, 0, 1),
    _c(256, 1, 5, 6, 2, 3, 0, 0, 1), _c(256, 2, 5, 5, 1, 2, 1, 0, 1),
    _c(256, 2, 5, 5, 1, 2, 0, 0, 1), _c(256, 2, 5, 5, 1, 2, 0, 2, 1),
    _c(256, 2, 4, 6, 1, 2, 0, 0, 1), _c(128, 2, 8, 8, 2, 1, 0, 0, 1),
    # a tile block's token blocks reading its columns together
    _c(256, 2, 5, 5, 1, 2, 1, 0, 0, 1), _c(256, 2, 5, 5, 1, 2, 0, 0, 0, 1),
    _c(256, 2, 5, 5, 1, 2, 0, 2, 0, 1), _c(256, 2, 5, 5, 1, 2, 0, 4, 0, 1),
    _c(256, 2, 5, 5, 2, 2, 0, 0, 0, 1), _c(256, 2, 4, 6, 1, 2, 0, 0, 0, 1),
    _c(256, 2, 5, 5, 1, 2, 1, 0, 1, 1),
    # the copies' L2 eviction hints
    _c(256, 2, 5, 5, 1, 2, 1, 0, 0, 0, 1), _c(256, 2, 5, 5, 1, 2, 1, 0, 0, 1, 1),
    _c(256, 2, 5, 5, 1, 2, 1, 0, 1, 0, 1), _c(256, 2, 5, 5, 1, 2, 1, 0, 1, 1, 1),
    _c(256, 2, 5, 5, 1, 2, 0, 0, 0, 0, 1), _c(256, 2, 5, 5, 1, 2, 0, 0, 1, 0, 1),
)


def label(cand: WglConfig | None) -> str:
    if cand is None:
        return "decode"
    return (f"wgmma_m{cand.block_m}_g{cand.warpgroups}_x{cand.x_stages}_w{cand.w_stages}"
            f"_k{cand.splits}"
            + ("_r", "_rp", "_ri")[cand.a_regs - 1] + ("_ps" if cand.persist else "")
            + (f"_t{cand.tail}" if cand.tail else "") + ("_xo" if cand.xorder else "")
            + ("_wr" if cand.wreuse else "") + ("_l2" if cand.l2hint else ""))


def entry(cand: WglConfig | None) -> dict:
    """A candidate as the table writes it (every field)."""
    return {"kind": "decode"} if cand is None else {"kind": "wgmma", **dataclasses.asdict(cand)}


def candidates(pattern: str | None = None) -> tuple:
    """Every choice the sweep times (decode + cuBLAS always; the warpgroup kernel where it can
    run), or only those whose label contains one of the comma-separated parts of
    ``pattern``."""
    cands = CANDIDATES if large.available() else ()
    if pattern:
        parts = pattern.split(",")
        cands = tuple(c for c in cands if any(p in label(c) for p in parts))
    return (None, *cands)


def applies(cand: WglConfig | None, n: int, m: int, sms: int) -> bool:
    """False for a candidate with a tail where that tail would change nothing at (N, M) on a
    GPU of ``sms`` multiprocessors (``tail_start``): it would time the launch without."""
    if cand is None or not cand.tail:
        return True
    return large.tail_start(math.ceil(n / 16), m, cand, sms) is not None


def runner(cand: WglConfig | None):
    """The warpgroup kernel with configuration ``cand``, or decode + cuBLAS for None."""
    def run(x, pw):
        if cand is None:
            weight = dispatch.decode(pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row,
                                     pw.esc_col, pw.esc_val, pw.n, pw.k)
            return torch.nn.functional.linear(x, weight)
        return large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_val,
                              pw.esc_delta, pw.esc_entry, pw.esc_fix, None, pw.n, pw.k, cand)
    return run


def run_sweep(m_values, shapes, rule: dict, pattern: str | None = None,
              keep_margin: float = 0.0) -> tuple[list[dict], dict]:
    """Time decode + cuBLAS and every candidate per shape and M (up to 128 rows also the
    small-kernel passes, for reference); return the rows and the large-M part to merge: per
    point the fastest choice within the error budget (``choose``). Each point's current entry
    (in ``rule``, the table in use) is timed at that point too, so that a restricted sweep
    (``pattern``) cannot replace it by the best of a few candidates."""
    cands = candidates(pattern)
    known, rows, current = cands, [], {}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k in shapes:
        layer = Layer(n, k, seed=n + k)
        for m in m_values:
            point = list(cands)
            cur = current_candidate(n, k, m, rule)
            if cur is not False:
                current[(n, k, m)] = label(cur)
                if cur not in point:
                    point.append(cur)
                    known = (*known, cur)
            runs = {label(c): runner(c) for c in point if applies(c, n, m, sms)}
            if m <= dispatch.SMALL_PASSES * table.SMALL_M_MAX:
                runs["small_passes"] = table_run
            t_ref, results = measure(layer, m, runs)
            for lbl, (t, e) in results.items():
                rows.append(dict(n=n, k=k, m=m, label=lbl, us=t, err_ratio=e, cublas_us=t_ref))
        del layer
        torch.cuda.empty_cache()
    return rows, choose(rows, known, current, keep_margin)


def current_candidate(n: int, k: int, m: int, rule: dict):
    """The table's entry for shape (N, K) at M class ``m`` exactly, as a candidate (None:
    decode + cuBLAS); False where the table has no such entry."""
    found = rule["shapes"].get(f"{n}x{k}", {}).get(str(m))
    return False if found is None else table.entry_config(found)


def choose(rows: list[dict], cands: tuple, current: dict | None = None,
           keep_margin: float = 0.0) -> dict:
    """The large-M part from the sweep's ``rows``: per (shape, M) the fastest choice within the
    error budget, except that the point's current entry (``current``: its label per (n, k, m))
    stays where the fastest was at most ``keep_margin`` (a fraction) faster. The default is the
    choice with the best geometric-mean speedup over all points."""
    current = current or {}
    by_label = {label(c): c for c in cands}
    labels = list(by_label)
    timed = {(r["n"], r["k"], r["m"], r["label"]): r for r in rows}
    points = sorted({(r["n"], r["k"], r["m"]) for r in rows})
    scores = {lbl: sum(speedup(timed.get((*p, lbl))) for p in points) for lbl in labels}
    default = max(scores, key=scores.get)
    shapes: dict = {}
    for n, k, m in points:
        best = max(labels, key=lambda lbl: speedup(timed.get((n, k, m, lbl))))
        cur = current.get((n, k, m))
        if cur in by_label and math.isfinite(speedup(timed.get((n, k, m, cur)))) and (
                speedup(timed.get((n, k, m, best))) - speedup(timed.get((n, k, m, cur)))
                <= math.log1p(keep_margin)):
            best = cur
        if math.isfinite(speedup(timed.get((n, k, m, best)))):
            shapes.setdefault(f"{n}x{k}", {})[str(m)] = entry(by_label[best])
    mean = math.exp(scores[default] / max(1, len(points)))
    print(f"large-M default {default}: geomean x{mean:.3f} over the swept points", flush=True)
    return {"default": entry(by_label[default]), "max_m": max(p[2] for p in points),
            "shapes": shapes}
