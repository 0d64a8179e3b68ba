"""Benchmark: the 8-bit view GEMM (``view8_linear``) against the exact W12 GEMM and cuBLAS BF16.

The two-level verifier's Q pass runs every linear of the target on the view of its W12 weights
(the high byte alone); it pays only as far as the view GEMM is cheaper than the exact one. For
real layer shapes and M in {1, ..., 128} this times, as CUDA-graph replays in the same run
cycling through several weight copies (``gemm.Layer``: the L2 never serves the weight), the
view GEMM, the exact W12 GEMM (what ``w12_linear`` runs) and cuBLAS on the BF16 weight. Each
row prints µs, the view's speed-up over the exact GEMM and over cuBLAS, its bytes read and
achieved TB/s, and its relative error against the float64 product of the view (over cuBLAS's
against the exact weights: the view's GEMM adds no error of its own beyond float32 sums). The
last lines are geometric means per M. ``--sweep`` tries every configuration of a small grid at
each (shape, M), the CUDA-core kernel's too at M <= 4, and prints the best, to tune
``view8.launcher.config_for``.

    python benchmarks/view8.py --models qwen3_8b,qwen3_32b --m 1,8,32 --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from gemm import MODELS, Layer, benchmark_layers, table_run
from harness import copy_bandwidth, environment, geomean, project_on_path, time_graphs, write_json

project_on_path()

import w12  # noqa: E402
from w12_kernels.view8 import prepare_view, view_bf16  # noqa: E402
from w12_kernels.view8.launcher import View8Config, config_for, gemm  # noqa: E402

M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128)
SWEEP = dict(block_n=(32, 64, 128), block_k=(128, 256), split=(1, 2, 4, 8), warps=(4,),
             stages=(3,))


class ViewLayer(Layer):
    """``gemm.Layer`` with the view of each weight copy packed for the view GEMM."""

    def __init__(self, n: int, k: int, seed: int):
        super().__init__(n, k, seed)
        self.view = [prepare_view(w12.encode(w)) for w in self.bf16]

    def view_bytes(self, m: int) -> int:
        v = self.view[0]
        return v.nbytes + 2 * m * self.k + 2 * m * self.n


def time_three(layer: ViewLayer, x: torch.Tensor, config: View8Config | None = None,
               calls_per_copy: int = 4) -> list[float]:
    """µs per call of the view GEMM, the exact W12 GEMM and cuBLAS, replayed in alternation."""
    order = [i % layer.copies for i in range(layer.copies * calls_per_copy)]
    return time_graphs([
        [lambda i=i: gemm(x, layer.view[i], config=config) for i in order],
        [lambda i=i: table_run(x, layer.w12[i]) for i in order],
        [lambda i=i: torch.nn.functional.linear(x, layer.bf16[i]) for i in order],
    ])


def view_error(layer: ViewLayer, x: torch.Tensor, config: View8Config | None) -> float:
    """Relative error of the view GEMM against float64 on the view's weights, over cuBLAS's
    against float64 on the exact weights."""
    view = view_bf16(w12.encode(layer.bf16[0])).double()
    ref = x.double() @ view.T
    err = (gemm(x, layer.view[0], config=config).double() - ref).norm() / ref.norm()
    exact = x.double() @ layer.bf16[0].double().T
    err_bf16 = (torch.nn.functional.linear(x, layer.bf16[0]).double() - exact).norm() \
        / exact.norm()
    return float(err / err_bf16)


GEMV_SWEEP = dict(block_n=(16, 32, 64), block_k=(128, 256, 512), split=(1, 2, 4, 8),
                  warps=(4,), stages=(3,))


def sweep_configs(m: int):
    block_m = min(128, max(16, 1 << max(m - 1, 0).bit_length()))
    for bn, bk, split, warps, stages in itertools.product(*SWEEP.values()):
        yield View8Config(bn, block_m, bk, split, warps, stages)
    if m <= 4:  # the CUDA-core kernel, all rows in one program
        rows = 1 << max(m - 1, 0).bit_length()
        for bn, bk, split, warps, stages in itertools.product(*GEMV_SWEEP.values()):
            yield View8Config(bn, rows, bk, split, warps, stages, gemv=True)


def best_config(layer: ViewLayer, x: torch.Tensor) -> tuple[View8Config, float]:
    """The fastest configuration of the sweep at this shape and M (µs of the view GEMM alone)."""
    order = [i % layer.copies for i in range(layer.copies * 4)]
    best = None
    for c in sweep_configs(x.shape[0]):
        try:
            (t,) = time_graphs([[lambda i=i, c=c: gemm(x, layer.view[i], config=c)
                                 for i in order]], rounds=3)
        except Exception as exc:  # a configuration the compiler refuses (shared memory)
            print(f"  skipped {c}: {type(exc).__name__}", flush=True)
            continue
        if best is None or t < best[1]:
            best = (c, t)
    return best


def run(layers, m_values, ceiling: float, sweep: bool) -> list[dict]:
    rows = []
    for model, name, n, k in layers:
        layer = ViewLayer(n, k, seed=n * 7 + k)
        for m in m_values:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            config = None
            if sweep:
                config, _ = best_config(layer, x)
            t_view, t_w12, t_ref = time_three(layer, x, config)
            used = config or config_for(m, n, k, torch.cuda.get_device_properties(0)
                                        .multi_processor_count)
            row = dict(model=model, layer=name, n=n, k=k, m=m, view_us=t_view, w12_us=t_w12,
                       cublas_us=t_ref, over_w12=t_w12 / t_view, over_cublas=t_ref / t_view,
                       view_bytes=layer.view_bytes(m), config=used.__dict__,
                       err_ratio=view_error(layer, x, config))
            row["view_tbs"] = row["view_bytes"] / t_view / 1e6
            row["view_of_copy"] = row["view_tbs"] / ceiling
            rows.append(row)
            print(f"{model:>10} {name:>8} {n:>6}x{k:<6} M={m:<4} view {t_view:8.2f} us  "
                  f"w12 {t_w12:8.2f} us  cublas {t_ref:8.2f} us  x{row['over_w12']:5.2f} w12  "
                  f"x{row['over_cublas']:5.2f} cublas  {row['view_tbs']:5.2f} TB/s "
                  f"({100 * row['view_of_copy']:3.0f}%)  err/bf16 {row['err_ratio']:.2f}  "
                  f"{used}", flush=True)
        del layer
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--shapes", default=None, help="NxK,... instead of the models' layers")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--sweep", action="store_true",
                        help="time every configuration of a small grid and use the best")
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("view8.py: needs a CUDA GPU")
    layers = benchmark_layers(args.models.split(","), args.shapes)
    m_values = [int(v) for v in args.m.split(",")]
    torch.manual_seed(0)
    ceiling = copy_bandwidth()
    env = environment()
    print(f"device {env['gpu']}, {env['sms']} SMs; copy bandwidth {ceiling:.2f} TB/s",
          flush=True)
    start = time.time()
    rows = run(layers, m_values, ceiling, args.sweep)
    means = {m: geomean([r["over_w12"] for r in rows if r["m"] == m]) for m in m_values}
    write_json(args.json, rows, env, copy_tbs=ceiling, geomean_over_w12=means,
               sweep=args.sweep)
    print(f"\nelapsed {time.time() - start:.0f} s")
    for m, g in means.items():
        worst = min(r["over_w12"] for r in rows if r["m"] == m)
        cub = geomean([r["over_cublas"] for r in rows if r["m"] == m])
        print(f"geomean view / exact W12 M={m:<4} x{g:.3f} (worst x{worst:.2f}); "
              f"view / cuBLAS x{cub:.3f}")


if __name__ == "__main__":
    main()
