"""Where the time of one small-M W12 GEMM call goes, warp by warp, on the GPU.

    python3 benchmarks/small_timeline.py --shapes 6144x4096,4096x4096 --m 1,16,32

The small-M kernel (``kernels.cu``) compiled with ``W12_TIMELINE``: lane 0 of every warp writes
``%globaltimer`` at its entry, when its first column's MMAs issue (weights and activations
in), at its middle column, at the end of its main loop, after the epilogue's first barrier
(the partial tiles summed) and after its last store, with its multiprocessor. Each (shape, M)
runs the table's layout (or ``--layout``), after the weight copies of ``benchmarks/gemm.py``'s
``Layer`` have pushed it out of L2, one call per weight copy; the report is the median call.
The same call is timed without the stamps against cuBLAS (``time_pair``) so the stamped
kernel's span can be compared with its real time. Printed per (shape, M): the span from the
first warp's entry to the last warp's last store, the spread of the entries, the time to
the first column, the main loop's time per column (first and second half), the epilogue, and
how far the last warp's end lies past the median warp's. All times in us.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gemm import Layer, time_pair  # noqa: E402

from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import cuda  # noqa: E402

WORDS = 1 << 21  # W12_TL_WORDS in kernels.cu


def _timeline_kernel(index: int, name: str):
    """The instantiation ``name`` compiled with the stamps, and the device array they go to."""
    import cupy

    major, minor = torch.cuda.get_device_capability(index)
    with cupy.cuda.Device(index):
        module = cupy.RawModule(code="#define W12_TIMELINE 1\n" + cuda._source(),
                                options=("--std=c++17", f"--gpu-architecture=sm_{major}{minor}"),
                                name_expressions=[name])
        return module.get_function(name), module.get_global("w12_tl")


def _call(x: torch.Tensor, pw, kw: int, lay: cfgs.Layout) -> torch.Tensor:
    """The small-M kernel on ``x`` and the packed weight ``pw`` with ``kw`` and ``lay``."""
    return cuda.gemm_small(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta, None,
                           pw.n, pw.k, kw=kw, depth=lay.depth, prefetch=lay.prefetch,
                           tiles=lay.tiles, min_blocks=lay.min_blocks, x_stages=lay.x_stages,
                           groups=lay.groups, w_stages=lay.w_stages, cluster=lay.cluster)


def _run_stamped(layer: Layer, m: int, kw: int, lay: cfgs.Layout) -> dict:
    """One stamped call per weight copy (each after the others, so its weight is not in L2);
    the stats of the median call by span."""
    import cupy

    name = cuda.kernel_name(-(-m // 8), lay.depth, lay.prefetch, lay.tiles, lay.min_blocks,
                            lay.x_stages, lay.groups, kw, lay.w_stages, lay.cluster)
    func, buf = _timeline_kernel(0, name)
    tl = cupy.ndarray((WORDS,), dtype=cupy.uint64, memptr=buf)
    plain = cuda._kernel
    cuda._small_kernel.cache_clear()
    cuda._kernel = lambda index, n: func if n == name else plain(index, n)
    try:
        x = torch.randn(m, layer.k, device="cuda").to(torch.bfloat16)
        calls = []
        for i in range(2 * layer.copies):
            pw = layer.w12[i % layer.copies]
            tl.fill(0)
            torch.cuda.synchronize()
            _call(x, pw, kw, lay)
            torch.cuda.synchronize()
            if i >= layer.copies:  # the first round compiles and warms up
                calls.append(_stats(tl.get(), layer, kw, lay))
    finally:
        cuda._kernel = plain
        cuda._small_kernel.cache_clear()
    calls.sort(key=lambda s: s["span"])
    return calls[len(calls) // 2]


def _stats(words, layer: Layer, kw: int, lay: cfgs.Layout) -> dict:
    ntiles = -(-layer.n // 16)
    nchunks = -(-layer.k // 64)
    blocks = -(-ntiles // (lay.tiles * lay.groups)) * lay.cluster
    warps_per_block = kw // lay.cluster * lay.groups
    n_warps = blocks * warps_per_block
    rows = words[: n_warps * 8].reshape(n_warps, 8).astype("int64")
    live = rows[:, 0] > 0
    rows = rows[live]
    t0 = rows[:, 0].min()
    st = (rows[:, :6] - t0) / 1e3  # us from the first entry
    cols = -(-nchunks // kw)  # columns of warp 0 (the others: the same or one fewer)
    med = statistics.median
    sms = {}
    for sm in rows[:, 7]:
        sms[int(sm)] = sms.get(int(sm), 0) + 1
    per_sm = sorted(sms.values())
    first = st[:, 1] - st[:, 0]
    half1 = (st[:, 2] - st[:, 1]) / max(1, cols // 2)
    half2 = (st[:, 3] - st[:, 2]) / max(1, cols - 1 - cols // 2)
    return dict(
        span=float(st[:, 5].max()), entry_spread=float(st[:, 0].max()),
        entry_p90=float(sorted(st[:, 0])[int(0.9 * (len(st) - 1))]),
        first_col=float(med(first)), first_col_max=float(first.max()),
        col_half1=float(med(half1)), col_half2=float(med(half2)),
        loop=float(med(st[:, 3] - st[:, 1])), loop_end_max=float(st[:, 3].max()),
        loop_end_med=float(med(st[:, 3])),
        to_barrier=float(med(st[:, 4] - st[:, 3])), stores=float(med(st[:, 5] - st[:, 4])),
        epilogue_max=float((st[:, 5] - st[:, 3]).max()),
        end_med=float(med(st[:, 5])), end_max=float(st[:, 5].max()),
        warps=int(len(rows)), cols=cols, sms=len(sms),
        warps_per_sm=f"{per_sm[0]}-{per_sm[-1]}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="6144x4096,4096x4096,8192x8192,28672x4096")
    parser.add_argument("--m", default="1,16,32")
    parser.add_argument("--layout", default=None,
                        help="JSON of a layout (config.Layout fields) and kw to run instead of "
                             "the table's, e.g. '{\"kw\": 4, \"tiles\": 1, \"depth\": 1}'")
    parser.add_argument("--no-escapes", action="store_true",
                        help="run with every row's escape range empty (wrong outputs wherever a "
                             "row has escapes: for timing what the escape corrections cost)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not cuda.available():
        print("small_timeline: needs a CUDA GPU and CuPy", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    print(f"{'shape':>12} {'M':>3} {'layout':<28} {'us':>6} {'cublas':>6} {'span':>6} "
          f"{'entry':>5} {'1st col':>7} {'col/us':>11} {'loop':>5} {'bar':>4} {'store':>5} "
          f"{'end med/max':>11} warps/SM")
    for spec in args.shapes.split(","):
        n, k = (int(v) for v in spec.split("x"))
        layer = Layer(n, k, seed=n + k)
        if args.no_escapes:
            for pw in layer.w12:
                pw.esc_rowptr.zero_()
        cfg = cfgs.small_config(n, k, sms)
        for m in (int(v) for v in args.m.split(",")):
            kw, lay = cfg.kw, cfg.layout(m)
            if args.layout:
                d = json.loads(args.layout)
                kw = d.pop("kw", kw)
                lay = cfgs.Layout.from_dict({**dataclasses.asdict(cfgs.Layout()), "wg": None, **d})
            t_w12, t_ref = time_pair(layer, m, lambda x, pw, kw=kw, lay=lay: _call(x, pw, kw, lay))
            s = _run_stamped(layer, m, kw, lay)
            label = (f"kw{kw} d{lay.depth} t{lay.tiles} b{lay.min_blocks} xs{lay.x_stages} "
                     f"g{lay.groups} ws{lay.w_stages} c{lay.cluster}")
            print(f"{n:>6}x{k:<5} {m:>3} {label:<28} {t_w12:6.2f} {t_ref:6.2f} "
                  f"{s['span']:6.2f} {s['entry_spread']:5.2f} {s['first_col']:7.2f} "
                  f"{s['col_half1']:5.3f}/{s['col_half2']:5.3f} {s['loop']:5.2f} "
                  f"{s['to_barrier']:4.2f} {s['stores']:5.2f} "
                  f"{s['end_med']:5.2f}/{s['end_max']:5.2f} {s['warps_per_sm']}", flush=True)
            out.append(dict(n=n, k=k, m=m, kw=kw, layout=label, us=t_w12, cublas_us=t_ref, **s))
        del layer
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
