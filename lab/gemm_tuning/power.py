"""The small-M schedules under sustained load: a decode run streams for seconds and, on an
H200 at 32 rows, W12 draws close to the 700 W limit and the clock drops, which short bursts of
replays do not see. Each schedule's graph (the calls cycling through weight copies past the
L2) is replayed back to back for seconds while ``nvidia-smi`` samples clock and power; the
report is µs per call, mean SM MHz, mean W and µJ per call, for cuBLAS, the table's schedule
and the fastest other schedules of the small-M sweep at the table's kw (picked by a burst
timing first; every one checked for the table's bits). A winner replaces the table's layout of
its class (never the kw, so no sum changes) and the class is listed in the shape's
``sustained``, which a later burst sweep keeps while the shape keeps its kw.
"""

from __future__ import annotations

import time

import torch

from gemm_tuning import small
from gemm_tuning.timing import Layer, capture, nt_class, table_run, time_graphs
from w12_kernels.gemm import dispatch

# the four layer shapes of the Qwen3-32B preset (qkv, o, gate_up, down)
DEFAULT_SHAPES = "10240x5120,5120x8192,51200x5120,5120x25600"


def sustained(calls, seconds: float, cool: float) -> dict:
    """Replays the graph of ``calls`` for about ``seconds``; µs per call and the clocks."""
    from engine.gpu_clocks import ClockSampler

    graph = capture(calls)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    torch.cuda.synchronize()
    replays = max(1, int(seconds / max(start.elapsed_time(stop) * 1e-3, 1e-6)))
    time.sleep(cool)
    with ClockSampler(torch.device("cuda"), interval_ms=50) as clocks:
        start.record()
        for _ in range(replays):
            graph.replay()
        stop.record()
        torch.cuda.synchronize()
    us = start.elapsed_time(stop) * 1e3 / (replays * len(calls))
    st = clocks.stats
    watts = None if st is None else st.power_w_mean
    return dict(us=us, sm_mhz=None if st is None else st.sm_mhz_mean,
                watts=watts, uj=None if watts is None else watts * us,
                power_capped=None if st is None else st.power_capped)


def shape_rows(layer: Layer, m: int, candidates: int, seconds: float, cool: float) -> list:
    n, k = layer.n, layer.k
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    cfg = dispatch.small_config(n, k, torch.device("cuda"))
    runs, layouts = {"table": table_run}, {}
    for lbl, kw, lay in small.sweep_candidates(n, k, m, (cfg.kw,)):
        runs[lbl] = small.runner(kw, lay)
        layouts[lbl] = small.layout_dict(lay)
    want = table_run(x, layer.w12[0])
    ok = {}
    for lbl, run in runs.items():
        try:
            same = torch.equal(run(x, layer.w12[0]), want)
        except Exception as exc:  # a schedule that does not compile or fit is skipped
            print(f"  {lbl}: failed ({type(exc).__name__}: {str(exc)[:80]})", flush=True)
            continue
        if not same:
            raise SystemExit(f"{n}x{k} M={m}: {lbl} gives other bits than the table")
        ok[lbl] = run
    burst = dict(zip(ok, time_graphs([[lambda i=i, r=run: r(x, layer.w12[i]) for i in order]
                                      for run in ok.values()], rounds=5), strict=True))
    ranked = sorted((t, lbl) for lbl, t in burst.items() if lbl != "table")
    rows = [dict(shape=f"{n}x{k}", m=m, schedule="cublas", burst_us=None,
                 **sustained([lambda i=i: torch.nn.functional.linear(x, layer.bf16[i])
                              for i in order], seconds, cool))]
    for lbl in ["table"] + [lbl for _, lbl in ranked[:candidates]]:
        r = sustained([lambda i=i, r=ok[lbl]: r(x, layer.w12[i]) for i in order], seconds, cool)
        rows.append(dict(shape=f"{n}x{k}", m=m, schedule=lbl, burst_us=burst[lbl],
                         layout=layouts.get(lbl), **r))
    for r in rows:
        print_row(r, rows[0]["us"])
    return rows


def choose(rows: list[dict], margin: float) -> dict:
    """{(shape, NT class): layout} where a schedule's sustained time beats the table's row of
    the same shape and M by more than ``margin`` (a fraction); the fastest such schedule."""
    out, best = {}, {}
    tabled = {(r["shape"], r["m"]): r["us"] for r in rows if r["schedule"] == "table"}
    for r in rows:
        key = (r["shape"], r["m"])
        if r.get("layout") is None or key not in tabled:
            continue
        if r["us"] < tabled[key] * (1 - margin) and r["us"] < best.get(key, float("inf")):
            best[key] = r["us"]
            out[(r["shape"], str(nt_class(r["m"])))] = r["layout"]
    return out


def apply_choices(part: dict, choices: dict) -> dict:
    """The small-M part with the chosen layouts in the shapes' entries, each class listed in
    ``sustained`` (a shape without an entry of its own is left to the rule: nothing
    written)."""
    shapes = {**part.get("shapes", {})}
    for (shape, cls), layout in sorted(choices.items()):
        if shape not in shapes:
            print(f"  {shape}: no entry of its own in the table, not written", flush=True)
            continue
        entry = {**shapes[shape]}
        entry["by_nt"] = {**entry.get("by_nt", {}), cls: dict(layout)}
        entry["sustained"] = sorted({*entry.get("sustained", ()), cls})
        shapes[shape] = entry
    return {**part, "shapes": shapes}


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_row(r: dict, ref_us: float) -> None:
    print(f"{r['shape']:>11} M={r['m']:<3} {r['schedule']:<28} burst {_fmt(r['burst_us'], '8.2f')}"
          f" us  sustained {r['us']:8.2f} us (x{ref_us / r['us']:.3f})  "
          f"{_fmt(r['sm_mhz'], '5.0f')} MHz  {_fmt(r['watts'], '4.0f')} W  "
          f"{_fmt(r['uj'], '8.0f')} uJ/call"
          + ("" if r.get("power_capped") is None
             else f"  capped {100 * r['power_capped']:.0f}%"), flush=True)
