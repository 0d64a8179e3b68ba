"""Probe of the large-M kernel's multicast pairs (``mcast``, docs/PERF_GEMM.md #66) on an H200.

First, for each configuration, how many of its thread-block clusters the GPU holds at once
(the driver's ``cuOccupancyMaxActiveClusters`` with the kernel's shared memory and threads):
a grid of more blocks than that runs in two waves. Then, at 256 rows, the kernel with and
without pairs on shapes where both fit one wave (and on the 4096- and 8192-row layers, where
the pairs' clusters of 4 do not), timed with cuBLAS in the same CUDA graphs (``time_graphs``).

    python benchmarks/wgl_multicast_probe.py
"""

from __future__ import annotations

import ctypes
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import gemm as G  # noqa: E402
from w12_kernels.gemm import cuda  # noqa: E402
from w12_kernels.gemm import cuda_large as cl  # noqa: E402

KEYS = ("block_m", "warpgroups", "x_stages", "w_stages", "splits", "a_regs", "persist", "mcast")
CFGS = [(256, 1, 5, 6, 2, 3, 0, 0), (256, 1, 5, 6, 2, 3, 0, 1), (256, 2, 5, 5, 2, 2, 0, 0),
        (256, 2, 5, 5, 2, 2, 0, 1), (256, 2, 5, 5, 3, 2, 0, 0), (256, 1, 5, 8, 1, 3, 0, 0),
        (256, 1, 5, 8, 1, 3, 0, 1), (256, 2, 5, 5, 1, 2, 0, 1), (256, 2, 5, 5, 4, 2, 0, 1)]
# shape -> indices into CFGS
JOBS = {(2048, 14336): [0, 1, 2, 3], (2048, 4096): [0, 1, 2, 3], (4096, 14336): [0, 1, 4],
        (4096, 4096): [0, 1, 4], (6144, 4096): [5, 6, 2, 3], (8192, 8192): [2, 3]}


def max_active_clusters(cfg: tuple, grid: tuple) -> int | str:
    """The clusters of ``cfg`` (its compile-time cluster shape) the GPU holds at once."""
    func = cl._function(0, cfg)
    smem = cl.shared_bytes(*cfg[:4], *cfg[5:7], splits=cfg[4])
    launch = cuda._LaunchConfig(grid, (cl.threads(cfg[1], cfg[5]), 1, 1), smem, None, None, 0)
    out = ctypes.c_int(-1)
    rc = cuda.driver().cuOccupancyMaxActiveClusters(
        ctypes.byref(out), ctypes.c_void_p(cuda._function_ptr(func, 0)), ctypes.byref(launch))
    return out.value if rc == 0 else f"error {rc}"


def call(x: torch.Tensor, w, n: int, k: int, kw: dict):
    return lambda: cl.gemm_wgl(x, w.chunks, w.scale, w.esc_rowptr, w.esc_row, w.esc_col,
                               w.esc_val, w.esc_delta, w.esc_order,
                               w.esc_entry, w.esc_fix, None, n, k, **kw)


def main() -> None:
    for cfg in CFGS:
        size = cfg[4] * (2 if cfg[7] else 1)
        grid = (64 if cfg[1] == 1 else 32, 1, cfg[4])
        print(f"{cl.kernel_name(*cfg):30s} cluster {size}: max active clusters "
              f"{max_active_clusters(cfg, grid)}", flush=True)
    for (n, k), idx in JOBS.items():
        layer = G.Layer(n, k, seed=n + k)
        x = torch.randn(256, k, device="cuda").to(torch.bfloat16)
        order = [i % layer.copies for i in range(layer.copies * 4)]
        lists = [[call(x, layer.w12[i], n, k, dict(zip(KEYS, CFGS[j], strict=True)))
                  for i in order] for j in idx]
        lists.append([lambda w=layer.bf16[i], x=x: torch.nn.functional.linear(x, w)
                      for i in order])
        *times, t_ref = G.time_graphs(lists)
        for j, t in zip(idx, times, strict=True):
            blocks = math.ceil(n / (64 * CFGS[j][1]))
            blocks += blocks % 2 if CFGS[j][7] else 0
            print(f"{n}x{k} M=256 {cl.kernel_name(*CFGS[j]):30s} {blocks * CFGS[j][4]:4d} "
                  f"blocks {t:8.2f} us", flush=True)
        print(f"{n}x{k} M=256 cublas {t_ref:.2f} us", flush=True)
        del layer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
