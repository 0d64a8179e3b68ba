"""Benchmark: W12 GEMM (``w12_linear``) against cuBLAS BF16 (``torch.nn.functional.linear``).

For real layer shapes and M in {1, ..., 256} it times both in the same run as CUDA-graph replays
of back-to-back calls that cycle through several copies of the weight (so the 60 MB L2 never
serves the weight), on random data. Each row prints µs, speedup, bytes read and achieved TB/s;
the device-to-device copy bandwidth measured at start is the ceiling. The last lines are the
geometric-mean speedup per M. ``--sweep`` times candidate kernel configurations instead.

    python benchmarks/gemm.py --models llama8b --m 1,16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import w12  # noqa: E402
from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import launcher  # noqa: E402
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


def graph_time_us(calls, reps: int = 7) -> float:
    """Median per-call time of a CUDA graph that runs ``calls`` (a list of thunks) in order."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls[:2]:
            call()  # compile / allocate outside capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    del graph
    return sorted(times)[len(times) // 2]


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
        pw = self.w12[0]
        np_, kp = pw.padded_shape
        # the kernel reads only the row tiles' real columns; padded rows are read too
        k_read = math.ceil(self.k / 256) * 256
        planes = np_ * k_read * 3 // 2
        esc = pw.num_escapes * 12 + (np_ + 1) * 4
        return planes + np_ * 4 + esc + 2 * m * self.k + 2 * m * self.n

    def bf16_bytes(self, m: int) -> int:
        return 2 * self.n * self.k + 2 * m * self.k + 2 * m * self.n


def time_pair(layer: Layer, m: int, run_w12, calls_per_copy: int = 4):
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * calls_per_copy)]
    t_w12 = graph_time_us([lambda i=i: run_w12(x, layer.w12[i]) for i in order])
    t_ref = graph_time_us(
        [lambda i=i: torch.nn.functional.linear(x, layer.bf16[i]) for i in order]
    )
    return t_w12, t_ref


def check(layer: Layer, m: int, run_w12) -> float:
    """Relative RMS error of W12 against float64 on the exact weights, over cuBLAS's."""
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    ref = x.double() @ layer.bf16[0].double().T
    err = (run_w12(x, layer.w12[0]).double() - ref).norm() / ref.norm()
    err_bf16 = (torch.nn.functional.linear(x, layer.bf16[0]).double() - ref).norm() / ref.norm()
    return float(err / err_bf16)


def default_run(x: torch.Tensor, pw: PackedW12) -> torch.Tensor:
    return launcher.linear(x, pw.planes, pw.scale, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                           pw.esc_val, pw.esc_delta, pw.counters, None, pw.n, pw.k)


def run_benchmark(models, m_values, ceiling: float) -> list[dict]:
    rows = []
    for model in models:
        for name, n, k in layer_shapes(model):
            layer = Layer(n, k, seed=n * 7 + k)
            for m in m_values:
                ratio = check(layer, m, default_run)
                t_w12, t_ref = time_pair(layer, m, default_run)
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

SMALL_CLASS_MAX = 40_000_000  # weights; layers up to this size get their own configuration
SWEEP_SHAPES = {"small": [(4096, 4096), (6144, 4096)],
                "large": [(4096, 14336), (28672, 4096), (10240, 8192), (57344, 8192)]}
SWEEP_LARGE_M_SHAPES = [(4096, 4096), (28672, 4096)]
BLOCKS = [  # block_n, block_k, num_warps, num_stages
    (64, 256, 4, 3), (64, 256, 4, 4), (64, 128, 4, 4), (32, 256, 4, 4), (128, 128, 8, 3),
    (128, 256, 8, 2)]
WAVES = (1.0, 2.0, 4.0)
LARGE_BLOCKS = [  # block_n, block_m, block_k, num_warps, num_stages
    (64, 128, 64, 4, 3), (128, 128, 64, 8, 3)]


def _small_cfg(n, k, sms, key, use_asm=True) -> cfgs.GemmConfig:
    bn, bk, warps, stages, waves = key
    split = cfgs.pick_split(-(-n // bn), -(-k // bk), sms, waves=waves)
    return cfgs.GemmConfig(block_n=bn, block_k=bk, split_k=split, num_warps=warps,
                           num_stages=stages, use_asm=use_asm)


def _large_cfg(key) -> cfgs.GemmConfig:
    bn, bm, bk, warps, stages = key
    return cfgs.GemmConfig(block_n=bn, block_k=bk, split_k=1, num_warps=warps,
                           num_stages=stages, block_m=bm, max_chunks=1, esc_chunk=2)


def _measure(layer: Layer, m: int, runs: dict) -> tuple[float, dict]:
    """cuBLAS time and {label: (time, error over cuBLAS's error)} for thunk makers ``runs``."""
    x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    t_ref = graph_time_us([lambda i=i: torch.nn.functional.linear(x, layer.bf16[i])
                           for i in order])
    ref = x.double() @ layer.bf16[0].double().T
    err_bf16 = float((torch.nn.functional.linear(x, layer.bf16[0]).double() - ref).norm()
                     / ref.norm())
    out = {}
    for label, run in runs.items():
        try:
            err = float((run(x, layer.w12[0]).double() - ref).norm() / ref.norm()) / err_bf16
            t = graph_time_us([lambda i=i, r=run: r(x, layer.w12[i]) for i in order])
        except Exception as exc:  # a candidate that does not compile or fit is skipped
            print(f"  {label}: failed ({type(exc).__name__}: {str(exc)[:100]})", flush=True)
            continue
        out[label] = (t, err)
    return t_ref, out


def _runner(cfg):
    return lambda x, pw: launcher.launch_packed(x, pw, None, cfg)


def _report(n, k, m, t_ref, results) -> list[dict]:
    ranked = sorted(results.items(), key=lambda kv: kv[1][0])
    print(f"{n}x{k} M={m}: cublas {t_ref:.2f} us; " + ", ".join(
        f"{lbl} {t:.2f} (x{t_ref / t:.2f}{'' if e <= 2 else f' ERR x{e:.0f}'})"
        for lbl, (t, e) in ranked), flush=True)
    return [dict(n=n, k=k, m=m, label=lbl, us=t, err_ratio=e, cublas_us=t_ref)
            for lbl, (t, e) in ranked]


def _best(rows: list[dict], labels) -> str | None:
    """The label with the best geometric-mean speedup among those correct on every row."""
    scores = {}
    for label in labels:
        mine = [r for r in rows if r["label"] == label]
        if not mine or any(r["err_ratio"] > 2 for r in mine):
            continue
        scores[label] = sum(math.log(r["cublas_us"] / r["us"]) for r in mine) / len(mine)
    return max(scores, key=scores.get) if scores else None


def run_sweep(m_small, m_large) -> tuple[list[dict], dict]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, table = [], {"small_m": [], "large_m": {"mode": "decode"}}
    keys = [(*b, w) for b in BLOCKS for w in WAVES]
    for cls, shapes in SWEEP_SHAPES.items():
        cls_rows = []
        for n, k in shapes:
            layer = Layer(n, k, seed=n + k)
            for m in m_small:
                runs = {str(key): _runner(_small_cfg(n, k, sms, key)) for key in keys}
                runs["plain_decode" + str(keys[0])] = _runner(
                    _small_cfg(n, k, sms, keys[0], use_asm=False))
                cls_rows += _report(n, k, m, *_measure(layer, m, runs))
            if (n, k) in SWEEP_LARGE_M_SHAPES:
                for m in m_large:
                    runs = {f"fused{key}": _runner(_large_cfg(key)) for key in LARGE_BLOCKS}
                    runs["decode+cublas"] = lambda x, pw: torch.nn.functional.linear(
                        x, launcher.decode(pw))
                    rows += _report(n, k, m, *_measure(layer, m, runs))
            del layer
            torch.cuda.empty_cache()
        rows += cls_rows
        best = _best(cls_rows, [str(key) for key in keys])
        if best:
            bn, bk, warps, stages, waves = {str(key): key for key in keys}[best]
            table["small_m"].append(dict(
                max_weights=SMALL_CLASS_MAX if cls == "small" else None, block_n=bn,
                block_k=bk, num_warps=warps, num_stages=stages, waves=waves))
    large_rows = [r for r in rows if r["m"] > 64]
    best = _best(large_rows, [f"fused{key}" for key in LARGE_BLOCKS] + ["decode+cublas"])
    if best and best.startswith("fused"):
        bn, bm, bk, warps, stages = {f"fused{key}": key for key in LARGE_BLOCKS}[best]
        table["large_m"] = dict(mode="fused", block_n=bn, block_m=bm, block_k=bk,
                                num_warps=warps, num_stages=stages)
    return rows, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--sweep", action="store_true", help="time candidate configurations")
    parser.add_argument("--write-table", action="store_true",
                        help="with --sweep: write the winners to w12_kernels/gemm/tuned.json")
    args = parser.parse_args()
    m_values = [int(v) for v in args.m.split(",")]
    torch.manual_seed(0)
    ceiling = copy_bandwidth()
    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name}, {props.multi_processor_count} SMs; "
          f"copy bandwidth {ceiling:.2f} TB/s (read + write)", flush=True)
    start = time.time()
    if args.sweep:
        rows, table = run_sweep([m for m in m_values if m <= 64], [m for m in m_values if m > 64])
        result = dict(device=props.name, copy_tbs=ceiling, sweep=rows, table=table)
        if len(table["small_m"]) == len(SWEEP_SHAPES) and args.write_table:
            cfgs.TUNED_PATH.write_text(json.dumps(table, indent=1) + "\n")
            print(f"wrote {cfgs.TUNED_PATH}: {json.dumps(table)}")
    else:
        rows = run_benchmark(args.models.split(","), m_values, ceiling)
        means = geomeans(rows)
        result = dict(device=props.name, copy_tbs=ceiling, rows=rows, geomean=means)
        print(f"\ncopy bandwidth {ceiling:.2f} TB/s; elapsed {time.time() - start:.0f} s")
        for m, g in means.items():
            worst = min(r["speedup"] for r in rows if r["m"] == m)
            print(f"geomean speedup M={m:<4} x{g:.3f}   (worst shape x{worst:.2f})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
