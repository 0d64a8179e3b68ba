"""Benchmark: W12 GEMM (``w12_linear``) against cuBLAS BF16 (``torch.nn.functional.linear``).

For real layer shapes and M in {1, ..., 256} it times both in the same run as CUDA-graph replays
of back-to-back calls that cycle through several copies of the weight (so the L2 never serves
the weight), on random data (``harness.time_graphs``). Each row prints µs, speedup, bytes read
and achieved TB/s; the device-to-device copy bandwidth measured at start is the ceiling. The
last lines are the geometric-mean speedup per M. ``--invariant-rows 64`` times what the
engine's prefill runs (65..128 rows through the large-M table instead of two batch-invariant
passes of the small kernel); ``--decode`` times the decode-to-BF16 kernel of the large-M path
against a copy of the BF16 weight.

    python benchmarks/gemm.py --models llama8b --m 1,16 --json out.json
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from harness import copy_bandwidth, environment, geomean, project_on_path, time_graphs, write_json

project_on_path()

import w12  # noqa: E402
from w12_kernels.gemm import dispatch, invariant_rows  # noqa: E402
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


def all_shapes() -> list[tuple[int, int]]:
    """Every distinct (N, K) of the models' layers."""
    return sorted({(n, k) for model in MODELS for _, n, k in layer_shapes(model)})


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


def error_ratio(layer: Layer, x: torch.Tensor, run) -> float:
    """Relative RMS error of ``run`` against float64 on the exact weights, over cuBLAS's."""
    ref = x.double() @ layer.bf16[0].double().T
    err = (run(x, layer.w12[0]).double() - ref).norm() / ref.norm()
    err_bf16 = (torch.nn.functional.linear(x, layer.bf16[0]).double() - ref).norm() / ref.norm()
    return float(err / err_bf16)


def table_run(x: torch.Tensor, pw: PackedW12) -> torch.Tensor:
    """What ``w12_linear`` runs on ``x`` (the op's body, without its checks)."""
    return dispatch.linear(x, pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row,
                           pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order, pw.esc_entry,
                           pw.esc_fix, None, pw.n, pw.k)


def run_benchmark(layers: list[tuple[str, str, int, int]], m_values, ceiling: float
                  ) -> list[dict]:
    rows = []
    for model, name, n, k in layers:
        layer = Layer(n, k, seed=n * 7 + k)
        for m in m_values:
            x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
            t_w12, t_ref = time_with_cublas(layer, x, [table_run])
            ratio = error_ratio(layer, x, table_run)  # after timing: see harness.time_graphs
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


def run_decode(shapes: list[tuple[int, int]], ceiling: float) -> list[dict]:
    """The decode-to-BF16 step of the large-M path alone (escapes written in), per weight
    shape, against a device copy of the BF16 weight timed in the same run. Bytes: the chunks
    read and the BF16 weight written (1.5 + 2 per weight); the copy moves 2 + 2."""
    rows = []
    for n, k in shapes:
        layer = Layer(n, k, seed=n * 7 + k)
        t_dec, t_copy = time_graphs(_decode_calls(layer))
        pw = layer.w12[0]
        got = _decode(pw)
        assert torch.equal(got.view(torch.int16), layer.bf16[0].view(torch.int16))
        tbs = (layer.w12_bytes(0) + 2 * n * k) / t_dec / 1e6
        rows.append(dict(n=n, k=k, decode_us=t_dec, decode_tbs=tbs, copy_us=t_copy,
                         escapes=layer.escapes))
        print(f"decode {n:>6}x{k:<6} {t_dec:8.2f} us {tbs:5.2f} TB/s ({100 * tbs / ceiling:3.0f}% "
              f"of copy)   copy of the BF16 weight {t_copy:8.2f} us", flush=True)
        del layer
        torch.cuda.empty_cache()
    return rows


def _decode(pw: PackedW12) -> torch.Tensor:
    return dispatch.decode(pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                           pw.esc_val, pw.n, pw.k)


def _decode_calls(layer: Layer) -> list[list]:
    """The thunks of the two timed graphs: decode every copy of the weight, copy every BF16
    copy."""
    order = [i % layer.copies for i in range(layer.copies * 4)]
    dst = torch.empty_like(layer.bf16[0])
    return [[lambda pw=layer.w12[i]: _decode(pw) for i in order],
            [lambda w=layer.bf16[i]: dst.copy_(w) for i in order]]


def print_row(r: dict) -> None:
    print(f"{r['model']:>10} {r['layer']:>8} {r['n']:>6}x{r['k']:<6} M={r['m']:<4} "
          f"w12 {r['w12_us']:8.2f} us  cublas {r['cublas_us']:8.2f} us  "
          f"x{r['speedup']:5.2f}  w12 {r['w12_tbs']:5.2f} TB/s ({100 * r['w12_of_copy']:4.0f}%)"
          f"  cublas {r['cublas_tbs']:5.2f} TB/s  err/bf16 {r['err_ratio']:.2f}", flush=True)


def geomeans(rows: list[dict]) -> dict[int, float]:
    return {m: geomean([r["speedup"] for r in rows if r["m"] == m])
            for m in sorted({r["m"] for r in rows})}


def benchmark_layers(models: list[str], shapes: str | None) -> list[tuple[str, str, int, int]]:
    """(model, layer, N, K) of the models' layers, or of ``shapes`` ("NxK,...") when given."""
    if shapes:
        return [("-", s, *map(int, s.split("x"))) for s in shapes.split(",")]
    return [(model, name, n, k) for model in models for name, n, k in layer_shapes(model)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--shapes", default=None, help="NxK,... instead of the models' layers")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--decode", action="store_true",
                        help="time the decode-to-BF16 kernel alone against a weight copy")
    parser.add_argument("--invariant-rows", type=int, default=128, choices=(64, 128),
                        help="batch invariance kept up to this many rows (64: the prefill "
                             "path, 65..128 rows through the large-M table)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemm.py: needs a CUDA GPU")
    m_values = [int(v) for v in args.m.split(",")]
    layers = benchmark_layers(args.models.split(","), args.shapes)
    torch.manual_seed(0)
    ceiling = copy_bandwidth()
    env = environment()
    print(f"device {env['gpu']}, {env['sms']} SMs; copy bandwidth {ceiling:.2f} TB/s "
          f"(read + write)", flush=True)
    start = time.time()
    if args.decode:
        rows = run_decode(sorted({(n, k) for _, _, n, k in layers}), ceiling)
        write_json(args.json, rows, env, copy_tbs=ceiling)
        return
    with invariant_rows(args.invariant_rows):
        rows = run_benchmark(layers, m_values, ceiling)
    means = geomeans(rows)
    write_json(args.json, rows, env, copy_tbs=ceiling, geomean=means,
               invariant_rows=args.invariant_rows)
    print(f"\ncopy bandwidth {ceiling:.2f} TB/s; elapsed {time.time() - start:.0f} s")
    for m, g in means.items():
        worst = min(r["speedup"] for r in rows if r["m"] == m)
        print(f"geomean speedup M={m:<4} x{g:.3f}   (worst shape x{worst:.2f})")


if __name__ == "__main__":
    main()
