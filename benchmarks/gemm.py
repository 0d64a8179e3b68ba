"""Benchmark: W12 GEMM (``w12_linear``) against cuBLAS BF16 (``torch.nn.functional.linear``).

For real layer shapes and M in {1, ..., 256} it times both in the same run as CUDA-graph replays
of back-to-back calls that cycle through several copies of the weight (so the 60 MB L2 never
serves the weight), on random data. Each row prints µs, speedup, bytes read and achieved TB/s;
the device-to-device copy bandwidth measured at start is the ceiling. The last lines are the
geometric-mean speedup per M. ``--sweep`` times candidate launch rules (config.py) instead.
``--invariant-rows 64`` times what the engine's prefill runs (65..128 rows through the large-M
table instead of two batch-invariant passes of the small kernel).

    python benchmarks/gemm.py --models llama8b --m 1,16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import w12  # noqa: E402
from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import cuda, launcher, triton_path  # noqa: E402
from w12_kernels.gemm.layout import PackedW12, prepare_weight  # noqa: E402

MODELS = {
    # name: (hidden, intermediate, q heads, kv heads, head dim, vocab)
    "llama8b": (4096, 14336, 32, 8, 128, 128256),
    "qwen3_8b": (4096, 12288, 32, 8, 128, 151936),
    "qwen3_32b": (5120, 25600, 64, 8, 128, 151936),
    "llama70b": (8192, 28672, 64, 8, 128, 128256),
}
M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
L2_BYTES = 60 << 20


def layer_shapes(model: str) -> list[tuple[str, int, int]]:
    hidden, inter, q, kv, hd, vocab = MODELS[model]
    return [
        ("qkv", (q + 2 * kv) * hd, hidden),
        ("o", hidden, q * hd),
        ("gate_up", 2 * inter, hidden),
        ("down", hidden, inter),
        ("lm_head", vocab, hidden),
    ]


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (TB/s)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return 2 * nbytes / sorted(times)[len(times) // 2] / 1e12


def _capture(calls) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` (thunks) in order, after running two of them eagerly (compile,
    allocate) and replaying it once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls[:2]:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_graphs(call_lists, rounds: int = 7) -> list[float]:
    """Median per-call µs of each list of thunks, each captured as one CUDA graph.

    The graphs are replayed in turn, round after round, so every candidate is timed under the
    same conditions: timing one graph's replays back to back right after heavy work (such as
    building a float64 reference of a 1 GB weight) measured the large layers up to 13% slower
    than the same kernel a moment later (docs/PERF_GEMM.md, "Timing method").
    """
    graphs = [_capture(calls) for calls in call_lists]
    times: list[list[float]] = [[] for _ in graphs]
    for _ in range(rounds):
        for graph, calls, out in zip(graphs, call_lists, times, strict=True):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / len(calls))
    del graphs
    return [sorted(t)[len(t) // 2] for t in times]


class Layer:
    """Several copies of one random BF16 weight and its W12 form, on the GPU."""

    def __init__(self, n: int, k: int, seed: int):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        base = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        self.n, self.k = n, k
        self.copies = max(2, math.ceil(3 * L2_BYTES / (2 * n * k)))
        self.bf16 = [base] + [base.roll(i, dims=1) for i in range(1, self.copies)]
        self.w12 = [prepare_weight(w12.encode(w)) for w in self.bf16]
        self.escapes = self.w12[0].num_escapes

    def w12_bytes(self, m: int) -> int:
        """Bytes a small-M call reads and writes: every chunk (padding included), the row
        scales and escape lists, x and y."""
        pw = self.w12[0]
        np_, kp = pw.padded_shape
        esc = pw.num_escapes * 8 + (np_ + 1) * 4
        return np_ * kp * 3 // 2 + np_ * 4 + esc + 2 * m * self.k + 2 * m * self.n

    def bf16_bytes(self, m: int) -> int:
        return 2 * self.n * self.k + 2 * m * self.k + 2 * m * self.n


def time_with_cublas(layer: Layer, x: torch.Tensor, runs, calls_per_copy: int = 4
                     ) -> list[float]:
    """µs per call of each ``run(x, w12)`` of ``runs`` and then of cuBLAS on ``x``, their graphs
    replayed in alternation, each cycling through the layer's weight copies."""
    order = [i % layer.copies for i in range(layer.copies * calls_per_copy)]
    return time_graphs(
        [[lambda i=i, run=run: run(x, layer.w12[i]) for i in order] for run in runs]
        + [[lambda i=i: torch.nn.functional.linear(x, layer.bf16[i]) for i in order]])


def time_pair(layer: Layer, m: int, run_w12, calls_per_copy: int = 4):
    """(W12 µs, cuBLAS µs) per call, the two graphs replayed in alternation."""
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    t_w12, t_ref = time_with_cublas(layer, x, [run_w12], calls_per_copy)
    return t_w12, t_ref


def check(layer: Layer, m: int, run_w12) -> float:
    """Relative RMS error of W12 against float64 on the exact weights, over cuBLAS's."""
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    ref = x.double() @ layer.bf16[0].double().T
    err = (run_w12(x, layer.w12[0]).double() - ref).norm() / ref.norm()
    err_bf16 = (torch.nn.functional.linear(x, layer.bf16[0]).double() - ref).norm() / ref.norm()
    return float(err / err_bf16)


def default_run(x: torch.Tensor, pw: PackedW12) -> torch.Tensor:
    return launcher.linear(x, pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row,
                           pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                           pw.esc_entry, pw.esc_fix, None, pw.n, pw.k)


def run_benchmark(models, m_values, ceiling: float) -> list[dict]:
    rows = []
    for model in models:
        for name, n, k in layer_shapes(model):
            layer = Layer(n, k, seed=n * 7 + k)
            for m in m_values:
                t_w12, t_ref = time_pair(layer, m, default_run)
                ratio = check(layer, m, default_run)  # after timing: see time_graphs
                row = dict(model=model, layer=name, n=n, k=k, m=m, w12_us=t_w12,
                           cublas_us=t_ref, speedup=t_ref / t_w12,
                           w12_bytes=layer.w12_bytes(m), cublas_bytes=layer.bf16_bytes(m),
                           escapes=layer.escapes, err_ratio=ratio)
                row["w12_tbs"] = row["w12_bytes"] / t_w12 / 1e6
                row["cublas_tbs"] = row["cublas_bytes"] / t_ref / 1e6
                row["w12_of_copy"] = row["w12_tbs"] / ceiling
                rows.append(row)
                print_row(row)
            del layer
            torch.cuda.empty_cache()
    return rows


def run_decode(models, ceiling: float) -> list[dict]:
    """The decode-to-BF16 step of the large-M path alone (``cuda.decode``, escapes written in),
    per distinct weight shape, against a device copy of the BF16 weight timed in the same run.
    Bytes: the chunks read and the BF16 weight written (1.5 + 2 per weight); the copy moves
    2 + 2."""
    rows = []
    shapes = sorted({(n, k) for model in models for _, n, k in layer_shapes(model)})
    for n, k in shapes:
        layer = Layer(n, k, seed=n * 7 + k)
        t_dec, t_copy = time_graphs(_decode_calls(layer))
        pw = layer.w12[0]
        got = cuda.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, n, k)
        assert torch.equal(got.view(torch.int16), layer.bf16[0].view(torch.int16))
        tbs = (layer.w12_bytes(0) + 2 * n * k) / t_dec / 1e6
        rows.append(dict(n=n, k=k, decode_us=t_dec, decode_tbs=tbs, copy_us=t_copy,
                         escapes=layer.escapes))
        print(f"decode {n:>6}x{k:<6} {t_dec:8.2f} us {tbs:5.2f} TB/s ({100 * tbs / ceiling:3.0f}% "
              f"of copy)   copy of the BF16 weight {t_copy:8.2f} us", flush=True)
        del layer
        torch.cuda.empty_cache()
    return rows


def _decode_calls(layer: Layer) -> list[list]:
    """The thunks of the two timed graphs: decode every copy of the weight, copy every BF16
    copy."""
    order = [i % layer.copies for i in range(layer.copies * 4)]
    dst = torch.empty_like(layer.bf16[0])

    def dec(pw: PackedW12):
        return lambda: cuda.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val,
                                   pw.n, pw.k)

    return [[dec(layer.w12[i]) for i in order],
            [lambda w=layer.bf16[i]: dst.copy_(w) for i in order]]


def print_row(r: dict) -> None:
    print(f"{r['model']:>10} {r['layer']:>8} {r['n']:>6}x{r['k']:<6} M={r['m']:<4} "
          f"w12 {r['w12_us']:8.2f} us  cublas {r['cublas_us']:8.2f} us  "
          f"x{r['speedup']:5.2f}  w12 {r['w12_tbs']:5.2f} TB/s ({100 * r['w12_of_copy']:4.0f}%)"
          f"  cublas {r['cublas_tbs']:5.2f} TB/s  err/bf16 {r['err_ratio']:.2f}", flush=True)


def geomeans(rows: list[dict]) -> dict[int, float]:
    out = {}
    for m in sorted({r["m"] for r in rows}):
        sp = [r["speedup"] for r in rows if r["m"] == m]
        out[m] = math.exp(sum(math.log(s) for s in sp) / len(sp))
    return out


# ---------------------------------------------------------------- configuration sweep

SWEEP_SHAPES = sorted({(n, k) for model in MODELS for _, n, k in layer_shapes(model)})
SWEEP_KW = (2, 4, 8, 16)  # kw 1 never won a shape of the table; 16: more warps on the
# 4096-row layers, whose 256 tiles x 8 warps fill 15.5 warps per multiprocessor
# per NT class, the candidate schedules (depth, prefetch, tiles, min_blocks, x_stages), then
# (..., groups) and the weight-staged ones; SWEEP_LAYOUTS in the order of LAYOUT_KEYS
_ONE_GROUP = {
    1: ((1, False, 1, 1, 0), (2, False, 1, 1, 0), (2, True, 1, 1, 0), (1, False, 1, 1, 2)),
    2: ((1, False, 1, 1, 0), (2, False, 1, 1, 0), (2, True, 1, 1, 0), (1, False, 2, 1, 0),
        (1, False, 1, 1, 3), (2, False, 1, 1, 3),
        # the register ring capped at 64 registers (kw <= 8: 4 blocks of the 8-warp bound;
        # kw 16: 2 of 16 warps), where the uncapped 72 cost a block per multiprocessor that
        # the layer needs (#45)
        (1, False, 1, 4, 0), (1, False, 1, 2, 0)),
    4: ((1, False, 1, 1, 0), (2, False, 1, 1, 0), (1, False, 1, 3, 0), (1, False, 2, 1, 0),
        (1, False, 3, 1, 0), (1, False, 2, 2, 0), (1, False, 1, 1, 3), (1, False, 2, 2, 3),
        (2, False, 1, 1, 3)),
    # (deeper rings, depth 2 with two tiles, depth 3, depth 2 capped, lost 1-34% on every shape
    # at 16 and 32 rows, run 187, docs/PERF_GEMM.md #51: not candidates)
    # (the activations one column ahead in registers lost 13-28% on every shape at 32 rows,
    # run 180, docs/PERF_GEMM.md #47: not candidates)
    8: ((1, False, 1, 1, 0), (1, False, 1, 2, 0), (1, False, 2, 1, 0), (1, False, 3, 1, 0),
        (2, False, 1, 1, 0), (1, False, 2, 1, 2), (1, False, 1, 2, 3)),
}
# several groups of kw warps per block on their own tiles, the same columns side by side, so
# that one group's activation loads are L1 hits for the others (activations re-read from L2
# cost ~20% at M = 32, docs/PERF_GEMM.md #27)
_GROUPED = {
    1: (),
    2: ((1, False, 1, 1, 0, 2), (1, False, 1, 1, 0, 4), (2, False, 1, 1, 0, 2)),
    4: ((1, False, 1, 1, 0, 2), (1, False, 2, 1, 0, 2), (1, False, 1, 1, 0, 4),
        (1, False, 1, 2, 0, 2)),
    8: ((1, False, 1, 1, 0, 2), (1, False, 2, 1, 0, 2), (1, False, 1, 1, 0, 4)),
}
# the weights through shared-memory stages filled by cp.async instead of the register ring, so
# that the chunks in flight per warp cost no registers (depth 1; activations in registers or in
# as many stages): (tiles, min_blocks, x_stages, w_stages)
_W_STAGED = {
    1: ((1, 1, 0, 3), (1, 1, 0, 4), (1, 1, 0, 6), (1, 1, 3, 3), (1, 1, 4, 4), (1, 1, 6, 6)),
    2: ((1, 1, 0, 3), (1, 1, 0, 4), (1, 2, 0, 4), (2, 1, 0, 3), (1, 1, 3, 3), (1, 1, 0, 6),
        (1, 2, 0, 3), (1, 2, 3, 3)),
    4: ((1, 2, 0, 4), (2, 2, 0, 3), (2, 2, 0, 4), (1, 3, 0, 3), (2, 3, 3, 3)),
    # (3-4 tiles a block with 2-4 weight stages lost 5-33% on every shape at 32 rows, run 181,
    # docs/PERF_GEMM.md #48: not candidates)
    8: ((1, 1, 0, 3), (2, 1, 0, 3), (1, 2, 0, 3)),
}
# each tile group's kw warps spread over the blocks of a thread-block cluster (kw / cluster
# warps a block): smaller blocks for the same K split. They won the 5120-row layers at 17-32
# rows (+6-11%) and not 6144x4096, whose uneven spread of 8-warp blocks they were built for
# (docs/PERF_GEMM.md #52): (tiles, min_blocks, cluster); min_blocks counts the cluster's blocks
# (of the 8-warp bound over cluster), so 4 with cluster 2 is the register cap of 2 with none
_CLUSTERED = {
    1: ((1, 4, 2), (2, 4, 2), (1, 8, 4), (2, 8, 4)),
    2: ((1, 4, 2), (2, 4, 2), (3, 3, 2), (1, 8, 4), (2, 8, 4)),
    4: ((1, 4, 2), (2, 4, 2), (2, 2, 2), (3, 3, 2), (3, 2, 2), (1, 8, 4), (2, 8, 4), (2, 4, 4)),
    8: ((1, 2, 2), (1, 3, 2), (1, 6, 4)),
}
SWEEP_LAYOUTS = {cls: tuple((*lay, 1, 0, 1) for lay in _ONE_GROUP[cls])
                 + tuple((*lay, 0, 1) for lay in _GROUPED[cls])
                 + tuple((1, False, t, b, xs, 1, ws, 1) for t, b, xs, ws in _W_STAGED[cls])
                 + tuple((1, False, t, b, 0, 1, 0, c) for t, b, c in _CLUSTERED[cls])
                 for cls in _ONE_GROUP}
LAYOUT_KEYS = ("depth", "prefetch", "tiles", "min_blocks", "x_stages", "groups", "w_stages",
               "cluster")


def _layout_dict(layout: tuple) -> dict:
    return dict(zip(LAYOUT_KEYS, layout, strict=True))
SWEEP_RULES = [dict(warps_per_sm=w, min_chunks_per_warp=c, max_kw=8)
               for w in (4, 8, 16, 32, 64, 128) for c in (2, 4, 8)]
SCORED_M = (1, 8, 16, 32)  # the M kw is chosen on (the bars; 1 and 8 bound the NT = 1
# class, whose layouts with activations in registers ran 3-13% slower at M = 8 than at 1,
# docs/PERF_GEMM.md #31); 64 only picks its layout


def _time_candidates(layer: Layer, m: int, runs: dict) -> tuple[float, dict]:
    """cuBLAS time and {label: (time, error over cuBLAS's error)} for thunk makers ``runs``,
    all timed in alternation (``time_graphs``), the errors checked afterwards."""
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    ok = {}
    for label, run in runs.items():
        try:
            run(x, layer.w12[0])
            ok[label] = run
        except Exception as exc:  # a candidate that does not compile or fit is skipped
            print(f"  {label}: failed ({type(exc).__name__}: {str(exc)[:100]})", flush=True)
    times = time_graphs([[lambda i=i: torch.nn.functional.linear(x, layer.bf16[i])
                          for i in order]]
                        + [[lambda i=i, r=run: r(x, layer.w12[i]) for i in order]
                           for run in ok.values()])
    ref = x.double() @ layer.bf16[0].double().T
    err_bf16 = float((torch.nn.functional.linear(x, layer.bf16[0]).double() - ref).norm()
                     / ref.norm())
    out = {}
    for (label, run), t in zip(ok.items(), times[1:], strict=True):
        err = float((run(x, layer.w12[0]).double() - ref).norm() / ref.norm()) / err_bf16
        out[label] = (t, err)
    return times[0], out


def _measure(layer: Layer, m: int, runs: dict) -> tuple[float, dict]:
    """``_time_candidates``, then one line: cuBLAS's time and every candidate's, fastest first
    (with its speedup, and ERR where its error is over twice cuBLAS's)."""
    t_ref, results = _time_candidates(layer, m, runs)
    ranked = sorted(results.items(), key=lambda kv: kv[1][0])
    print(f"{layer.n}x{layer.k} M={m}: cublas {t_ref:.2f} us; " + ", ".join(
        f"{lbl} {t:.2f} (x{t_ref / t:.2f}{'' if e <= 2 else f' ERR x{e:.0f}'})"
        for lbl, (t, e) in ranked), flush=True)
    return t_ref, results


def _small_schedule(kw: int, layout: tuple) -> tuple:
    """``cuda.kernel_name``'s arguments after NT for kw and a sweep layout."""
    d = _layout_dict(layout)
    return (d["depth"], d["prefetch"], d["tiles"], d["min_blocks"], d["x_stages"], d["groups"],
            kw, d["w_stages"], d["cluster"])


def _small_runner(kw: int, layout: tuple):
    def run(x, pw):
        return cuda.gemm_small(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta,
                               None, pw.n, pw.k, kw=kw, **_layout_dict(layout))
    return run


def _nt_class(m: int) -> int:
    return next(c for c in cfgs.NT_CLASSES if -(-m // 8) <= c)


def _speedup(r: dict | None) -> float:
    ok = r is not None and r["err_ratio"] <= 2 and math.isfinite(r["us"])
    return math.log(r["cublas_us"] / r["us"]) if ok else -math.inf


def _best_layouts(rows: list[dict], kw_of, points) -> tuple[dict, float]:
    """Per NT class, the schedule with the best summed log speedup when each shape uses
    ``kw_of(n, k)``; returns the schedules and the summed score over ``SCORED_M``."""
    table = {(r["n"], r["k"], r["m"], r["kw"], *(r[key] for key in LAYOUT_KEYS)): r
             for r in rows}
    by_nt, score = {}, 0.0
    for cls in sorted({_nt_class(m) for _, _, m in points}):
        mine = [p for p in points if _nt_class(p[2]) == cls]
        options = {lay: sum(_speedup(table.get((n, k, m, kw_of(n, k), *lay)))
                            for n, k, m in mine) for lay in SWEEP_LAYOUTS[cls]}
        lay, val = max(options.items(), key=lambda kv: kv[1])
        by_nt[str(cls)] = _layout_dict(lay)
        score += sum(_speedup(table.get((n, k, m, kw_of(n, k), *lay)))
                     for n, k, m in mine if m in SCORED_M)
    return by_nt, score


def choose_rule(rows: list[dict], sms: int, keep_kw: bool = False) -> tuple[dict, float]:
    """The table ``tuned.json`` holds: per swept shape its best kw (summed log speedup over
    ``SCORED_M``, each M at its best layout) and layouts; for other shapes the kw rule and
    layouts with the best geometric-mean speedup over the swept ones. NT classes the sweep did
    not time keep the layouts of the table in use (a sweep of M = 1, 16, 32 alone once reset
    the M = 64 layouts to the built-in defaults: 0.62x -> 0.44x). With ``keep_kw`` (each shape
    timed at the kw of the table in use only) the kw rule stays that of the table in use and
    the layouts for other shapes are scored at the kw each shape was timed with (scored by the
    rules instead, every layout came out -inf and the first one was written)."""
    points = sorted({(r["n"], r["k"], r["m"]) for r in rows})
    scored = [p for p in points if p[2] in SCORED_M]
    current = cfgs.rule()  # classes not swept keep the layouts of the table in use
    if keep_kw:
        timed = {(r["n"], r["k"]): r["kw"] for r in rows}
        by_nt, best_score = _best_layouts(rows, lambda n, k: timed[(n, k)], points)
        best = {key: current[key] for key in ("warps_per_sm", "min_chunks_per_warp", "max_kw")}
        best["by_nt"] = by_nt
    else:
        best, best_score = None, -math.inf
        for rule in SWEEP_RULES:
            def kw_of(n, k, rule=rule):
                return cfgs.pick_kw(-(-n // 16), -(-k // 64), sms, **rule)
            by_nt, score = _best_layouts(rows, kw_of, points)
            if best is None or score > best_score:
                best, best_score = dict(rule, by_nt=by_nt), score
    for cls in map(str, cfgs.NT_CLASSES):
        best["by_nt"].setdefault(cls, current["by_nt"].get(cls, cfgs.DEFAULT_RULE["by_nt"][cls]))
    best["shapes"] = {}
    for n, k in sorted({(p[0], p[1]) for p in points}):
        mine = [p for p in points if p[:2] == (n, k)]
        options = {kw: _best_layouts(rows, lambda *_, kw=kw: kw, mine) for kw in SWEEP_KW}
        kw, (by_nt, score) = max(options.items(), key=lambda kv: kv[1][1])
        if math.isfinite(score):
            entry = current.get("shapes", {}).get(f"{n}x{k}", {})
            kept = entry.get("by_nt", {})
            # a warpgroup-kernel choice (benchmarks/wgmma_probe.py --write-table) stays with
            # its class while the kw does (this sweep times the mma.sync layouts only); with
            # another kw it was never timed, so it goes
            same_kw = kw == entry.get("kw")
            kept = {cls: lay if same_kw else {key: v for key, v in lay.items() if key != "wg"}
                    for cls, lay in kept.items()}
            # so do the classes benchmarks/gemm_power.py chose by sustained timing: a burst
            # sweep does not see what they were chosen for (docs/PERF_GEMM.md #56)
            sustained = sorted(c for c in entry.get("sustained", ()) if same_kw and c in kept)
            swept = {cls: ({**lay, "wg": kept[cls]["wg"]}
                           if kept.get(cls, {}).get("wg") else lay)
                     for cls, lay in by_nt.items() if cls not in sustained}
            best["shapes"][f"{n}x{k}"] = dict(kw=kw, by_nt={**kept, **swept})
            if sustained:
                best["shapes"][f"{n}x{k}"]["sustained"] = sustained
    return best, math.exp(best_score / max(1, len(scored)))


def sweep_candidates(n: int, k: int, m: int, kws) -> list[tuple[str, int, tuple]]:
    """(label, kw, layout) of every schedule the sweep times for an (N, K) weight at M rows
    with each kw of ``kws``."""
    out = []
    for kw in kws:
        if -(-k // 64) // kw < 2:
            continue
        for lay in SWEEP_LAYOUTS[_nt_class(m)]:
            depth, prefetch, tiles, min_blocks, x_stages, groups, w_stages, cluster = lay
            if kw * groups > 32 or kw % cluster:
                continue
            label = (f"kw{kw}_d{depth}{'_xpf' if prefetch else ''}_t{tiles}"
                     f"_b{min_blocks}_xs{x_stages}"
                     + (f"_g{groups}" if groups > 1 else "")
                     + (f"_ws{w_stages}" if w_stages else "")
                     + (f"_c{cluster}" if cluster > 1 else ""))
            out.append((label, kw, lay))
    return out


def _compile_one(name: str) -> str:
    cuda._kernel(0, name)
    return name


def precompile(names, workers: int) -> None:
    """Compile the kernels ``names`` in ``workers`` processes (CuPy keeps each binary in its
    on-disk cache, where the sweep's own compile then finds it): a fresh machine spends
    minutes compiling a sweep's instantiations one after another otherwise."""
    import multiprocessing

    names = sorted(set(names))
    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in pool.imap_unordered(_compile_one, names):
            pass
    print(f"compiled {len(names)} kernels in {workers} processes, {time.time() - t0:.0f} s",
          flush=True)


def run_sweep(m_values, keep_kw: bool = False, shapes=None,
              workers: int = 0) -> tuple[list[dict], dict]:
    """Time every kw and schedule per shape and M (with ``keep_kw``, only the kw the table in
    use gives the shape, so a sweep of some M classes cannot move the split the others were
    tuned for); return the rows and the table. ``shapes``: only these (N, K) (the table then
    changes only their entries, ``merge_small``). ``workers`` > 0: compile every schedule
    first in that many processes."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def kws_of(n, k):
        return (cfgs.small_config(n, k, sms).kw,) if keep_kw else SWEEP_KW

    if workers:
        precompile([cuda.kernel_name(-(-m // 8), *_small_schedule(kw, lay))
                    for n, k in shapes or SWEEP_SHAPES for m in m_values
                    for _, kw, lay in sweep_candidates(n, k, m, kws_of(n, k))], workers)
    rows = []
    for n, k in shapes or SWEEP_SHAPES:
        layer = Layer(n, k, seed=n + k)
        for m in m_values:
            runs, meta = {}, {}
            for label, kw, lay in sweep_candidates(n, k, m, kws_of(n, k)):
                runs[label] = _small_runner(kw, lay)
                meta[label] = dict(kw=kw, **_layout_dict(lay))
            t_ref, results = _measure(layer, m, runs)
            for label, (t, e) in results.items():
                rows.append(dict(n=n, k=k, m=m, **meta[label], us=t, err_ratio=e,
                                 cublas_us=t_ref))
        del layer
        torch.cuda.empty_cache()
    table, mean = choose_rule(rows, sms, keep_kw)
    if shapes:
        table = merge_small(cfgs.rule(), table)
    print(f"rule for unswept shapes: geomean x{mean:.3f} on the swept ones; {json.dumps(table)}")
    return rows, {"small_m": table}


def merge_small(current: dict, swept: dict) -> dict:
    """The small-M table after a sweep of some shapes (``--sweep --shapes``): their entries
    (kw and the NT classes the sweep timed) replace the current ones; the rule for unlisted
    shapes, its default layouts and the other shapes' entries stay, since a handful of shapes
    says nothing about the rest."""
    return {**current, "shapes": {**current.get("shapes", {}), **swept.get("shapes", {})}}


# candidate block shapes of the fused large-M kernel:
# (tiles, block_m, num_warps, num_stages, maxnreg, splits)
LARGE_CANDIDATES = ((4, 64, 4, 3, 0, 1), (4, 128, 4, 3, 0, 1), (4, 128, 4, 3, 168, 1),
                    (4, 128, 4, 3, 128, 1), (4, 128, 8, 3, 0, 1), (4, 256, 8, 3, 0, 1),
                    (4, 256, 8, 3, 168, 1), (8, 128, 8, 3, 168, 1), (8, 64, 4, 3, 0, 1),
                    (4, 128, 4, 3, 168, 2), (4, 128, 4, 3, 168, 4), (4, 64, 4, 3, 0, 4))
LARGE_KEYS = ("tiles", "block_m", "num_warps", "num_stages", "maxnreg", "splits")
# candidates of the warpgroup-MMA kernel (kernels_large.cu, Hopper only):
# (block_m, warpgroups, x_stages, w_stages, splits, a_regs)
WGMMA_CANDIDATES = ((256, 2, 4, 3, 1, 0), (256, 2, 4, 3, 2, 0), (256, 2, 4, 3, 4, 0),
                    (256, 2, 3, 5, 1, 0), (256, 2, 3, 5, 2, 0), (256, 2, 3, 6, 1, 0),
                    (128, 2, 4, 8, 1, 0), (128, 2, 4, 8, 2, 0), (128, 2, 6, 6, 2, 0),
                    (128, 1, 6, 12, 1, 0), (256, 1, 4, 10, 1, 0),
                    # 85 KB of shared memory, registers capped: two blocks per multiprocessor
                    (128, 1, 3, 2, 1, 0), (128, 1, 3, 2, 2, 0),
                    # the decoded weights as the register operand (no A buffers; at 256 rows
                    # it spills without a producer warpgroup, 0.26-0.63x in run 84: not swept)
                    (128, 2, 4, 8, 1, 1), (128, 2, 4, 8, 2, 1), (128, 2, 6, 8, 2, 1),
                    # and a producer warpgroup that gives its registers away
                    (256, 2, 4, 6, 1, 2), (256, 2, 4, 6, 2, 2), (256, 2, 4, 5, 4, 2),
                    # more activation stages: the best on 17 of 18 shapes (run 92; 3 x 10,
                    # 4 x 8 and 128-row 6 x 10 won none and were dropped)
                    (256, 2, 5, 5, 1, 2), (256, 2, 5, 5, 2, 2), (128, 2, 8, 8, 2, 1),
                    # K in three ranges, clusters of 3: a 4096-row layer's 96 blocks fit one
                    # wave (run 102: the 256-row one wins the three 4096-wide layers, +3-16%)
                    (256, 2, 5, 5, 3, 2), (128, 2, 8, 8, 3, 1),
                    # stream-K: one block a multiprocessor, each a share of all the
                    # (tile, column) steps (cuda_large.stream_k_cuts), outputs stored from the
                    # accumulators while the next unit's columns land (#60)
                    (256, 2, 5, 5, 1, 2, 1), (256, 2, 4, 6, 1, 2, 1),
                    # one MMA warpgroup of 64 weight rows, decoded weights in registers (255
                    # registers without a producer warpgroup): twice the blocks of the same
                    # activation rows, so the one-wave layers fill the multiprocessors with
                    # half the K split; the 128-row x4_w5 ones two blocks a multiprocessor
                    (256, 1, 5, 8, 1, 1), (256, 1, 5, 8, 2, 1), (128, 1, 6, 12, 2, 1),
                    (128, 1, 4, 5, 1, 1), (128, 1, 4, 5, 2, 1),
                    # whole waves with one K range, the tile blocks past them in a second
                    # launch with K in 2-4 ranges (#64; timed only where that applies)
                    (256, 2, 5, 5, 1, 2, 0, 2), (256, 2, 5, 5, 1, 2, 0, 3),
                    (256, 2, 5, 5, 1, 2, 0, 4), (256, 2, 4, 6, 1, 2, 0, 2),
                    # the tile blocks past them as stream-K over every multiprocessor
                    (256, 2, 5, 5, 1, 2, 0, 1), (256, 2, 4, 6, 1, 2, 0, 1),
                    # two MMA warpgroups on one group of 64 weight rows, every other column
                    # each (#65): blocks of half the rows with two warpgroups' MMAs in flight
                    (256, 1, 5, 8, 1, 3), (256, 1, 5, 8, 2, 3), (256, 1, 5, 8, 3, 3),
                    (256, 1, 5, 6, 2, 3),
                    # blocks in pairs sharing each activation stage by multicast (#66): those
                    # of #65 with half the activation bytes per MMA, and the two-warpgroup ones
                    (256, 1, 5, 8, 1, 3, 0, 0, 1), (256, 1, 5, 8, 2, 3, 0, 0, 1),
                    (256, 1, 5, 6, 2, 3, 0, 0, 1), (256, 1, 5, 8, 3, 3, 0, 0, 1),
                    (256, 2, 5, 5, 1, 2, 0, 0, 1), (256, 2, 5, 5, 2, 2, 0, 0, 1),
                    # the activations straight from x, no image pass (#83): the table's
                    # kinds of entry at 256 rows
                    (256, 2, 5, 5, 2, 2, 0, 0, 0, 1), (256, 1, 5, 8, 2, 3, 0, 0, 0, 1),
                    (256, 1, 5, 6, 2, 3, 0, 0, 0, 1), (256, 2, 5, 5, 1, 2, 1, 0, 0, 1),
                    (256, 2, 5, 5, 1, 2, 0, 0, 0, 1), (256, 2, 5, 5, 1, 2, 0, 2, 0, 1),
                    (256, 2, 4, 6, 1, 2, 0, 0, 0, 1),
                    # (and the 128-row kind the table takes on two shapes, #83)
                    (128, 2, 8, 8, 2, 1, 0, 0, 0, 1),
                    # a tile block's token blocks reading its columns together (#84-#85): the
                    # table's kinds of entry at 512 and 1024 rows
                    (256, 2, 5, 5, 1, 2, 1, 0, 0, 0, 1), (256, 2, 5, 5, 1, 2, 0, 0, 0, 0, 1),
                    (256, 2, 5, 5, 1, 2, 0, 2, 0, 0, 1), (256, 2, 5, 5, 1, 2, 0, 4, 0, 0, 1),
                    (256, 2, 5, 5, 2, 2, 0, 0, 0, 0, 1), (256, 2, 4, 6, 1, 2, 0, 0, 0, 0, 1),
                    (256, 2, 5, 5, 1, 2, 1, 0, 0, 1, 1),
                    # the copies' L2 eviction hints (#91): stream-K's kinds of entry and the
                    # one-range kernel
                    (256, 2, 5, 5, 1, 2, 1, 0, 0, 0, 0, 1), (256, 2, 5, 5, 1, 2, 1, 0, 0, 0, 1, 1),
                    (256, 2, 5, 5, 1, 2, 1, 0, 0, 1, 0, 1), (256, 2, 5, 5, 1, 2, 1, 0, 0, 1, 1, 1),
                    (256, 2, 5, 5, 1, 2, 0, 0, 0, 0, 0, 1), (256, 2, 5, 5, 1, 2, 0, 0, 0, 1, 0, 1))
# (not candidates: cuBLAS's tiling of the one-wave layers, 128 weight rows x 64 tokens with the
# whole K, 0.33-0.52x at 256 rows against 0.71-0.89x for the table's entries, run 261, #68)
WGMMA_KEYS = ("block_m", "warpgroups", "x_stages", "w_stages", "splits", "a_regs", "persist",
              "tail", "mcast", "xorder", "wreuse", "l2hint")


def _wgmma_args(cand: tuple) -> tuple:
    """A warpgroup candidate's values in the order of WGMMA_KEYS (persist, tail, mcast, xorder,
    wreuse and l2hint 0 where not given)."""
    return cand[1:] + (0,) * (len(WGMMA_KEYS) + 1 - len(cand))


def _applies(cand: tuple | None, n: int, m: int) -> bool:
    """False for a candidate with a tail where that tail would change nothing at (N, M) on this
    GPU (``cuda_large.tail_plan``): it would time the same launch as the one without."""
    if cand is None or cand[0] != "wgmma":
        return True
    block_m, warpgroups, x_stages, w_stages, _, a_regs, _, tail, *_ = _wgmma_args(cand)
    if not tail:
        return True
    from w12_kernels.gemm import cuda_large

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return cuda_large.tail_start(math.ceil(n / 16), m, block_m, warpgroups, x_stages, w_stages,
                                 a_regs, tail, sms) is not None


def _large_runner(cand: tuple | None):
    """The fused kernel with block shape ``cand`` (its K split lowered as the launcher lowers
    it), the warpgroup-MMA kernel for a ``("wgmma", ...)`` candidate, or decode + cuBLAS for
    ``None``."""
    def run(x, pw):
        if cand is None:
            weight = launcher.decode(pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row,
                                     pw.esc_col, pw.esc_val, pw.n, pw.k)
            return torch.nn.functional.linear(x, weight)
        if cand[0] == "wgmma":
            from w12_kernels.gemm import cuda_large

            return cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                       pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                       pw.esc_entry, pw.esc_fix,
                                       None, pw.n, pw.k,
                                       **dict(zip(WGMMA_KEYS, _wgmma_args(cand), strict=True)))
        cfg = dict(zip(LARGE_KEYS, cand, strict=True))
        cfg["splits"] = launcher.split_count(cfg["splits"], x.shape[0], pw.k)
        return triton_path.gemm_large(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col,
                                      pw.esc_delta, None, pw.n, pw.k, **cfg)
    return run


def _large_label(cand: tuple | None) -> str:
    if cand is None:
        return "decode"
    if cand[0] == "wgmma":
        args = _wgmma_args(cand)
        return ("wgmma_m{}_g{}_x{}_w{}_k{}".format(*args[:5]) + ("", "_r", "_rp", "_ri")[args[5]]
                + ("_ps" if args[6] else "") + (f"_t{args[7]}" if args[7] else "")
                + ("_mc" if args[8] else "") + ("_xo" if args[9] else "")
                + ("_wr" if args[10] else "") + ("_l2" if args[11] else ""))
    return ("fused_t{}_m{}_w{}_s{}".format(*cand[:4]) + (f"_r{cand[4]}" if cand[4] else "")
            + (f"_k{cand[5]}" if cand[5] > 1 else ""))


def large_candidates(pattern: str | None = None) -> tuple:
    """Every large-M choice the sweep times (decode + cuBLAS always; the warpgroup-MMA kernel
    where it can run), or only those whose label contains one of the comma-separated parts of
    ``pattern``."""
    from w12_kernels.gemm import cuda_large

    wg = tuple(("wgmma", *c) for c in WGMMA_CANDIDATES) if cuda_large.available() else ()
    cands = (*LARGE_CANDIDATES, *wg)
    if pattern:
        parts = pattern.split(",")
        cands = tuple(c for c in cands if any(p in _large_label(c) for p in parts))
    return (None, *cands)


def _large_entry(cand: tuple | None) -> dict:
    if cand is None:
        return {"kind": "decode"}
    if cand[0] == "wgmma":
        (block_m, warpgroups, x_stages, w_stages, splits, a_regs, persist, tail, mcast, xorder,
         wreuse, l2hint) = _wgmma_args(cand)
        return {"kind": "wgmma", "tiles": 4 * warpgroups, "block_m": block_m,
                "num_stages": x_stages, "w_stages": w_stages, "splits": splits,
                **({"a_regs": a_regs} if a_regs else {}),
                **({"persist": persist} if persist else {}),
                **({"tail": tail} if tail else {}),
                **({"mcast": mcast} if mcast else {}),
                **({"xorder": xorder} if xorder else {}),
                **({"wreuse": wreuse} if wreuse else {}),
                **({"l2hint": l2hint} if l2hint else {})}
    return {"kind": "fused", **dict(zip(LARGE_KEYS, cand, strict=True))}


def current_candidate(n: int, k: int, m: int, rule: dict | None = None) -> tuple | None:
    """The sweep candidate that the large-M table in use (``rule``) has as its entry for shape
    (N, K) at M class ``m`` exactly; None where there is none to add (no such entry, one no
    candidate matches, or decode + cuBLAS, whose candidate is None and always timed). A
    warpgroup entry that no candidate matches (one with a key set by ``large_ab.py
    --write-table``, such as ``l2hint``) is its own candidate."""
    rule = rule or cfgs.large_rule(cfgs.current_gpu())
    entry = rule["shapes"].get(f"{n}x{k}", {}).get(str(m))
    if entry is None:
        return None
    hit = next((c for c in large_candidates() if _large_entry(c) == entry), None)
    if hit is None and entry.get("kind") == "wgmma":
        own = ("wgmma", entry.get("block_m"), entry.get("tiles", 0) // 4,
               entry.get("num_stages"), entry.get("w_stages"), entry.get("splits"),
               *(entry.get(key, 0) for key in WGMMA_KEYS[5:]))
        hit = own if _large_entry(own) == entry else None
    return hit


def run_sweep_large(m_values, shapes=None, pattern=None,
                    keep_margin: float = 0.0) -> tuple[list[dict], dict]:
    """Time decode + cuBLAS and every fused block shape per shape and M (and, up to 128 rows,
    the small-kernel passes the launcher uses there, for reference); return the rows and the
    ``large`` table: per shape and M the fastest choice within the error budget, and as the
    default the choice with the best geometric-mean speedup over all swept points. With
    ``pattern`` (some candidates only) the table's current entry of each point is timed too,
    so that a table written from the sweep keeps it unless a candidate beat it in the same
    rounds (a restricted sweep once replaced entries by the best of its few candidates). A
    point's current entry also stays where the fastest choice beat it by ``keep_margin`` (a
    fraction of its time) or less: ``choose_large``."""
    cands = large_candidates(pattern)
    known = cands  # every candidate timed somewhere, for the table's labels
    rows, current = [], {}
    for n, k in shapes or SWEEP_SHAPES:
        layer = Layer(n, k, seed=n + k)
        for m in m_values:
            # (a point's current entry is timed at that point only: carried on to the later
            # points, it made a restricted sweep re-time many unrelated configurations there,
            # and the table then took their noise-level reorderings)
            point = list(cands)
            # (without ``pattern`` every candidate is timed, the current entry among them)
            cur = current_candidate(n, k, m)
            if cur is not None:
                current[(n, k, m)] = _large_label(cur)
            if cur is not None and cur not in point:
                point.append(cur)
                if cur not in known:
                    known = (*known, cur)
            runs = {_large_label(c): _large_runner(c) for c in point if _applies(c, n, m)}
            if m <= launcher.SMALL_PASSES * cfgs.SMALL_M_MAX:
                runs["small_passes"] = default_run
            t_ref, results = _measure(layer, m, runs)
            for label, (t, e) in results.items():
                rows.append(dict(n=n, k=k, m=m, label=label, us=t, err_ratio=e,
                                 cublas_us=t_ref))
        del layer
        torch.cuda.empty_cache()
    return rows, choose_large(rows, known, current, keep_margin)


def choose_large(rows: list[dict], cands: tuple | None = None, current: dict | None = None,
                 keep_margin: float = 0.0) -> dict:
    """The large-M table from the sweep's ``rows``: per (shape, M) the fastest choice within
    the error budget, except that the point's current entry (``current``: its label per
    (n, k, m)) stays where the fastest was at most ``keep_margin`` (a fraction) faster. Within
    that margin the order is the sweep's noise: one table timed four times moved shapes by
    1-8% between runs (docs/PERF_GEMM.md #87), and a restricted sweep took such reorderings as
    wins. The default is the choice with the best geometric-mean speedup."""
    cands = cands or (None, *LARGE_CANDIDATES)
    current = current or {}
    by_label = {_large_label(c): c for c in cands}

    def entry(label: str) -> dict:
        return _large_entry(by_label[label])

    labels = list(by_label)
    table = {(r["n"], r["k"], r["m"], r["label"]): r for r in rows}
    points = sorted({(r["n"], r["k"], r["m"]) for r in rows})
    scores = {lbl: sum(_speedup(table.get((*p, lbl))) for p in points) for lbl in labels}
    default = max(scores, key=scores.get)
    shapes: dict = {}
    for n, k, m in points:
        best = max(labels, key=lambda lbl: _speedup(table.get((n, k, m, lbl))))
        cur = current.get((n, k, m))
        if cur in by_label and math.isfinite(_speedup(table.get((n, k, m, cur)))) and (
                _speedup(table.get((n, k, m, best))) - _speedup(table.get((n, k, m, cur)))
                <= math.log1p(keep_margin)):
            best = cur
        if math.isfinite(_speedup(table.get((n, k, m, best)))):
            shapes.setdefault(f"{n}x{k}", {})[str(m)] = entry(best)
    mean = math.exp(scores[default] / max(1, len(points)))
    print(f"large-M default {default}: geomean x{mean:.3f} over the swept points", flush=True)
    return {"default": entry(default), "max_m": max(p[2] for p in points), "shapes": shapes}


def merge_large(current: dict, swept: dict, keep_default: bool = True) -> dict:
    """The large-M table after a sweep: the swept (shape, M) entries replace the current ones;
    every other entry stays, the other M classes of a swept shape too (a 256-row sweep once
    dropped the 128-, 512- and 1024-row entries of every shape), and ``max_m`` is the larger
    of the two. The default stays unless ``keep_default`` is False (a sweep of every shape and
    candidate): a sweep of five shapes, or of a few candidates, once reset the default of all
    eighteen shapes to its own best."""
    shapes = cfgs.overlay_shapes(current.get("shapes", {}), swept.get("shapes", {}))
    max_m = max(current.get("max_m", 0), swept.get("max_m", 0))
    default = current["default"] if keep_default and "default" in current else swept["default"]
    return {**current, "default": default, "max_m": max_m, "shapes": shapes}


def merge_device_large(current: dict, swept: dict, device: str) -> dict:
    """The large-M table after a sweep written into ``device``'s section (``--device-table``):
    the swept (shape, M) entries replace that section's, its other entries stay, its ``max_m``
    is the larger of the two; the shared entries, the default and the other GPUs' sections are
    not touched (``config.large_rule`` overlays the section on the shared entries)."""
    sections = dict(current.get("by_device", {}))
    section = sections.get(device, {})
    shapes = cfgs.overlay_shapes(section.get("shapes", {}), swept.get("shapes", {}))
    sections[device] = {"max_m": max(int(section.get("max_m", 0)), swept.get("max_m", 0)),
                        "shapes": shapes}
    return {**current, "by_device": sections}


def write_large_table(swept: dict, device: str | None = None, keep_default: bool = True) -> dict:
    """Write a large-M table change (``{"shapes": ..., "max_m": ...}``, and a ``default`` where
    it replaces one) into tuned.json: into ``device``'s section (``merge_device_large``) or
    the shared entries (``merge_large``; the change whole where the file has no large-M
    entry); the rest of the file stays. Returns the ``large`` entry written."""
    old = json.loads(cfgs.TUNED_PATH.read_text()) if cfgs.TUNED_PATH.exists() else {}
    if device:
        large = merge_device_large(old.get("large", {}), swept, device)
    elif "large" in old:
        large = merge_large(old["large"], swept, keep_default)
    else:
        large = swept
    cfgs.TUNED_PATH.write_text(json.dumps(old | {"large": large}, indent=1) + "\n")
    return large


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--sweep", action="store_true", help="time candidate configurations")
    parser.add_argument("--keep-kw", action="store_true",
                        help="with --sweep: time only the kw of the table in use per shape")
    parser.add_argument("--shapes", default=None,
                        help="with --sweep or --sweep-large: only these NxK shapes, "
                             "comma-separated (the table keeps the other shapes' entries)")
    parser.add_argument("--sweep-large", action="store_true",
                        help="time the large-M choices (fused block shapes, warpgroup-MMA "
                             "kernel configurations, decode + cuBLAS)")
    parser.add_argument("--candidates", default=None,
                        help="with --sweep-large: only the choices whose label contains one of "
                             "these comma-separated parts (decode + cuBLAS and each point's "
                             "current table entry are always timed)")
    parser.add_argument("--keep-margin", type=float, default=2.0,
                        help="with --sweep-large: a point's current table entry stays unless "
                             "it took more than this many percent longer than the fastest "
                             "choice (default 2, about the run-to-run noise; 0: the fastest)")
    parser.add_argument("--decode", action="store_true",
                        help="time the decode-to-BF16 kernel alone against a weight copy")
    parser.add_argument("--compile-workers", type=int, default=min(16, os.cpu_count() or 1),
                        help="with --sweep: processes that compile the schedules before the "
                             "timing (0: each compiled when first timed)")
    parser.add_argument("--write-table", action="store_true",
                        help="with --sweep: write the winners to w12_kernels/gemm/tuned.json")
    parser.add_argument("--device-table", action="store_true",
                        help="with --sweep-large --write-table: into this GPU model's section "
                             "of the large-M table (read on that model only, over the shared "
                             "entries), not the shared entries")
    parser.add_argument("--invariant-rows", type=int, default=128, choices=(64, 128),
                        help="batch invariance kept up to this many rows (64: the prefill "
                             "path, 65..128 rows through the large-M table)")
    args = parser.parse_args()
    if args.device_table and not (args.sweep_large and args.write_table):
        parser.error("--device-table goes with --sweep-large --write-table")
    m_values = [int(v) for v in args.m.split(",")]
    torch.manual_seed(0)
    ceiling = copy_bandwidth()
    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name}, {props.multi_processor_count} SMs; "
          f"copy bandwidth {ceiling:.2f} TB/s (read + write)", flush=True)
    start = time.time()
    if args.decode:
        rows = run_decode(args.models.split(","), ceiling)
        result = dict(device=props.name, copy_tbs=ceiling, decode=rows)
    elif args.sweep or args.sweep_large:
        shapes = [tuple(map(int, v.split("x"))) for v in args.shapes.split(",")] \
            if args.shapes else None
        if args.sweep:
            rows, table = run_sweep([m for m in m_values if m <= 64], args.keep_kw, shapes,
                                    args.compile_workers)
        else:
            rows, large = run_sweep_large([m for m in m_values if m > 64], shapes,
                                          args.candidates, args.keep_margin / 100)
            table = {"large": large}
        result = dict(device=props.name, copy_tbs=ceiling, sweep=rows, table=table)
        if args.write_table and args.sweep_large:  # the other entries stay as they are
            every = not args.shapes and not args.candidates
            table = {"large": write_large_table(table["large"],
                                                props.name if args.device_table else None,
                                                keep_default=not every)}
        elif args.write_table:
            old = json.loads(cfgs.TUNED_PATH.read_text()) if cfgs.TUNED_PATH.exists() else {}
            cfgs.TUNED_PATH.write_text(json.dumps(old | table, indent=1) + "\n")
        if args.write_table:
            print(f"wrote w12_kernels/gemm/{cfgs.TUNED_PATH.name}: {json.dumps(table)}")
    else:
        with launcher.invariant_rows(args.invariant_rows):
            rows = run_benchmark(args.models.split(","), m_values, ceiling)
        means = geomeans(rows)
        result = dict(device=props.name, copy_tbs=ceiling, rows=rows, geomean=means,
                      invariant_rows=args.invariant_rows)
        print(f"\ncopy bandwidth {ceiling:.2f} TB/s; elapsed {time.time() - start:.0f} s")
        for m, g in means.items():
            worst = min(r["speedup"] for r in rows if r["m"] == m)
            print(f"geomean speedup M={m:<4} x{g:.3f}   (worst shape x{worst:.2f})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
