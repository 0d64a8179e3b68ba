"""W12 GEMM schedules against cuBLAS under sustained load: time, SM clock, power and energy per
call (on the GPU).

``benchmarks/gemm.py`` times short bursts of replays, during which the GPU holds its top clock.
A decode run streams for seconds and, on an H200 at batch 32, W12 draws close to the 700 W
limit and the clock drops (docs/PERF_ENGINE.md). This script replays one CUDA graph per
schedule (the calls cycle through weight copies past the L2, as in ``gemm.py``) back to back for
``--seconds`` while ``nvidia-smi`` samples the clock and power, and reports µs per call, mean
SM MHz, mean W, µJ per call (W x µs) and the share of samples the driver power-capped, for
cuBLAS, the table's schedule and the ``--candidates`` fastest other schedules of the sweep at
the table's kw (picked by a short burst timing first). Each schedule's output is checked
against the table's bits (the same kw and the same sums: must be equal). Between schedules the
GPU idles ``--cool`` seconds.

With ``--write-table`` the schedule with the shortest sustained time replaces the table's for
that shape and class of M (``tuned.json``) where it beats it by more than ``--margin``: the
schedule changes, never the kw, so no sum changes. The class is listed in the shape entry's
``sustained``, and a later burst sweep (``gemm.py --sweep --write-table``) keeps it while the
shape keeps its kw (docs/PERF_GEMM.md #56); delete the list to let a sweep pick again.

    python benchmarks/gemm_power.py --shapes 10240x5120,51200x5120 --m 32 --seconds 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm import (  # noqa: E402
    Layer,
    _capture,
    _layout_dict,
    _nt_class,
    _small_runner,
    _small_schedule,
    default_run,
    precompile,
    sweep_candidates,
    time_graphs,
)
from engine.gpu_clocks import ClockSampler  # noqa: E402
from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import cuda, launcher  # noqa: E402

# the four layer shapes of the Qwen3-32B preset (qkv, o, gate_up, down)
DEFAULT_SHAPES = "10240x5120,5120x8192,51200x5120,5120x25600"


def sustained(calls, seconds: float, cool: float) -> dict:
    """Replays the graph of ``calls`` for about ``seconds``; µs per call and the clocks."""
    graph = _capture(calls)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    torch.cuda.synchronize()
    per_replay = max(start.elapsed_time(stop) * 1e-3, 1e-6)
    replays = max(1, int(seconds / per_replay))
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
                sm_mhz_min=None if st is None else st.sm_mhz_min, watts=watts,
                uj=None if watts is None else watts * us,
                power_capped=None if st is None else st.power_capped)


def shape_rows(layer: Layer, m: int, candidates: int, seconds: float, cool: float) -> list:
    n, k = layer.n, layer.k
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    cfg = launcher.small_config(n, k, torch.device("cuda"))
    runs, layouts = {"table": default_run}, {}
    for label, kw, lay in sweep_candidates(n, k, m, (cfg.kw,)):
        runs[label] = _small_runner(kw, lay)
        layouts[label] = _layout_dict(lay)
    want = default_run(x, layer.w12[0])
    ok = {}
    for label, run in runs.items():
        try:
            same = torch.equal(run(x, layer.w12[0]), want)
        except Exception as exc:  # a schedule that does not compile or fit is skipped
            print(f"  {label}: failed ({type(exc).__name__}: {str(exc)[:80]})", flush=True)
            continue
        if not same:
            raise SystemExit(f"{n}x{k} M={m}: {label} gives other bits than the table")
        ok[label] = run
    burst = time_graphs([[lambda i=i, r=run: r(x, layer.w12[i]) for i in order]
                         for run in ok.values()], rounds=5)
    ranked = sorted((t, label) for label, t in zip(ok, burst, strict=True) if label != "table")
    picked = ["table"] + [label for _, label in ranked[:candidates]]
    burst_of = dict(zip(ok, burst, strict=True))
    rows = []
    ref = sustained([lambda i=i: torch.nn.functional.linear(x, layer.bf16[i]) for i in order],
                    seconds, cool)
    rows.append(dict(shape=f"{n}x{k}", m=m, schedule="cublas", burst_us=None, **ref))
    for label in picked:
        run = ok[label]
        r = sustained([lambda i=i, r=run: r(x, layer.w12[i]) for i in order], seconds, cool)
        rows.append(dict(shape=f"{n}x{k}", m=m, schedule=label, burst_us=burst_of[label],
                         layout=layouts.get(label), **r))
    for r in rows:
        print_row(r, ref["us"])
    return rows


def choose_sustained(rows: list[dict], margin: float) -> dict:
    """{(shape, NT class): layout} where a schedule's sustained time beats the table's row of
    the same shape and M by more than ``margin`` (a fraction); the fastest such schedule."""
    out, best = {}, {}
    table = {(r["shape"], r["m"]): r["us"] for r in rows if r["schedule"] == "table"}
    for r in rows:
        key = (r["shape"], r["m"])
        if r.get("layout") is None or key not in table:
            continue
        if r["us"] < table[key] * (1 - margin) and r["us"] < best.get(key, float("inf")):
            best[key] = r["us"]
            out[(r["shape"], str(_nt_class(r["m"])))] = r["layout"]
    return out


def apply_choices(table: dict, choices: dict) -> dict:
    """``tuned.json``'s content with the ``choose_sustained`` layouts in the shapes' by_nt
    entries (a shape without an entry of its own is left to the rule: nothing written)."""
    small = table["small_m"]
    shapes = {**small.get("shapes", {})}
    for (shape, cls), layout in sorted(choices.items()):
        if shape not in shapes:
            print(f"  {shape}: no entry of its own in the table, not written", flush=True)
            continue
        entry = {**shapes[shape]}
        entry["by_nt"] = {**entry.get("by_nt", {}), cls: dict(layout)}
        # (a burst sweep at the same kw keeps these classes, benchmarks/gemm.py choose_rule)
        entry["sustained"] = sorted({*entry.get("sustained", ()), cls})
        shapes[shape] = entry
    return {**table, "small_m": {**small, "shapes": shapes}}


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_row(r: dict, ref_us: float) -> None:
    print(f"{r['shape']:>11} M={r['m']:<3} {r['schedule']:<28} burst {_fmt(r['burst_us'], '8.2f')}"
          f" us  sustained {r['us']:8.2f} us (x{ref_us / r['us']:.3f})  "
          f"{_fmt(r['sm_mhz'], '5.0f')} MHz (min {_fmt(r['sm_mhz_min'], '5.0f')})  "
          f"{_fmt(r['watts'], '4.0f')} W  {_fmt(r['uj'], '8.0f')} uJ/call"
          + ("" if r.get("power_capped") is None
             else f"  capped {100 * r['power_capped']:.0f}%"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="NxK,... (default: 32B's)")
    parser.add_argument("--m", default="32", help="rows, comma-separated (<= 64)")
    parser.add_argument("--candidates", type=int, default=4,
                        help="other schedules timed sustained besides the table's")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--cool", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=8,
                        help="processes compiling the schedules first (0: compile as needed)")
    parser.add_argument("--write-table", action="store_true",
                        help="write the sustained winners into w12_kernels/gemm/tuned.json")
    parser.add_argument("--margin", type=float, default=0.01,
                        help="how much faster than the table's schedule a winner must be")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemm_power: needs a CUDA GPU")
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        ms = [int(v) for v in args.m.split(",")]
    except ValueError:
        raise SystemExit(f"gemm_power: bad --shapes or --m: {args.shapes!r} {args.m!r}") from None
    if any(len(s) != 2 for s in shapes) or any(not 1 <= m <= 64 for m in ms):
        raise SystemExit("gemm_power: --shapes are NxK, --m between 1 and 64")
    if args.write_table and len({_nt_class(m) for m in ms}) != len(ms):
        raise SystemExit("gemm_power: --write-table takes one M per class (1-8, 9-16, 17-32, "
                         "33-64): a class has one schedule")
    if args.workers:
        dev = torch.device("cuda")
        precompile([cuda.kernel_name(-(-m // 8), *_small_schedule(kw, lay))
                    for n, k in shapes for m in ms
                    for _, kw, lay in sweep_candidates(
                        n, k, m, (launcher.small_config(n, k, dev).kw,))], args.workers)
    rows = []
    for n, k in shapes:
        layer = Layer(n, k, seed=0)  # (its weight copies serve every M)
        for m in ms:
            rows += shape_rows(layer, m, args.candidates, args.seconds, args.cool)
        del layer
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.write_table:
        choices = choose_sustained(rows, args.margin)
        table = apply_choices(json.loads(cfgs.TUNED_PATH.read_text()), choices)
        cfgs.TUNED_PATH.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote w12_kernels/gemm/{cfgs.TUNED_PATH.name}: "
              + (", ".join(f"{s} NT {c}: {lay}" for (s, c), lay in sorted(choices.items()))
                 or "no change"))


if __name__ == "__main__":
    main()
