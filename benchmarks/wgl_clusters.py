"""How many clusters of the large-M kernel the GPU holds at once (the driver's
``cuOccupancyMaxActiveClusters``), for the table's configuration of each shape and the same
configuration with K in 1-4 ranges: the blocks of the grid, the cluster size, the clusters the
GPU can run together and so the waves the grid takes. No kernel runs; the kernels are compiled
and loaded (GPU, compute capability 9.0).

A K split in 3 ranges lost on 5120x8192 at 256 rows (74 against 50 us), and the guess was that
3-block clusters do not all fit at once (docs/PERF_GEMM.md): this answers that for every
shape.

    python benchmarks/wgl_clusters.py --m 256
"""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm import SWEEP_SHAPES  # noqa: E402
from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import cuda, cuda_large  # noqa: E402


def table_tuple(n: int, k: int, m: int) -> tuple[int, ...] | None:
    """The table's configuration at ``m`` rows as ``cuda_large``'s config tuple (None: not the
    warpgroup kernel)."""
    e = cfgs.large_config(n, k, m)
    if e.kind != "wgmma":
        return None
    return (e.block_m, e.tiles // 4, e.num_stages, e.w_stages, e.splits, e.a_regs, e.persist,
            e.mcast)


def variants(cfg: tuple[int, ...]) -> list[tuple[int, ...]]:
    """``cfg`` with K in 1-4 ranges (stream-K entries as they are: one block a multiprocessor),
    those ``cuda_large.check_config`` accepts."""
    if cfg[6]:
        return [cfg]
    out = []
    for s in cuda_large.SPLITS:
        c = (*cfg[:4], s, *cfg[5:])
        try:
            cuda_large.check_config(*c)
        except ValueError:
            continue
        out.append(c)
    return out


def grid_of(cfg: tuple[int, ...], n: int, m: int) -> tuple[int, int, int]:
    """The grid ``gemm_wgl`` launches for one K range per cluster rank (no tail, no stream-K)."""
    block_m, wgs, splits, mcast = cfg[0], cfg[1], cfg[4], cfg[7]
    tile_blocks = math.ceil(math.ceil(n / 16) / (4 * wgs))
    return (tile_blocks + (tile_blocks % 2 if mcast else 0), math.ceil(m / block_m), splits)


def max_active_clusters(cfg: tuple[int, ...], grid: tuple[int, int, int]) -> int:
    """The driver's answer for this kernel (its cluster shape is compiled in); a kernel without
    a cluster (one K range, no pairs), which that query does not take: its blocks a
    multiprocessor holds (``cuOccupancyMaxActiveBlocksPerMultiprocessor``) times the
    multiprocessors."""
    func = cuda_large._function(0, cfg)
    fptr = cuda._function_ptr(func, 0)
    smem = cuda_large.shared_bytes(*cfg[:4], *cfg[5:7], splits=cfg[4])
    threads = cuda_large.threads(cfg[1], cfg[5])
    count = ctypes.c_int(0)
    if cfg[4] * (2 if cfg[7] else 1) == 1:
        fn = cuda.driver().cuOccupancyMaxActiveBlocksPerMultiprocessor
        fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int,
                       ctypes.c_size_t]
        fn.restype = ctypes.c_int
        err = fn(ctypes.byref(count), fptr, threads, smem)
        if err != 0:
            raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err}")
        return count.value * torch.cuda.get_device_properties(0).multi_processor_count
    launch = cuda._LaunchConfig(grid, (threads, 1, 1), smem, None, None, 0)
    fn = cuda.driver().cuOccupancyMaxActiveClusters
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                   ctypes.POINTER(cuda._LaunchConfig)]
    fn.restype = ctypes.c_int
    err = fn(ctypes.byref(count), fptr, ctypes.byref(launch))
    if err != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed with CUresult {err}")
    return count.value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=256, help="activation rows (> 64)")
    parser.add_argument("--shapes", default=None, help="NxK,... (default: the benchmark's)")
    args = parser.parse_args()
    if not cuda_large.available():
        raise SystemExit("wgl_clusters: needs a compute-capability 9.0 GPU and CuPy")
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else SWEEP_SHAPES)
    print("shape | kernel | table | blocks | cluster | clusters at once | blocks at once | "
          "waves", flush=True)
    for n, k in shapes:
        cfg = table_tuple(n, k, args.m)
        if cfg is None:
            print(f"{n}x{k} | the table's choice at {args.m} rows is not the warpgroup kernel")
            continue
        for c in variants(cfg):
            if c[6]:
                print(f"{n}x{k} | {cuda_large.kernel_name(*c)} | yes | stream-K: one block a "
                      "multiprocessor")
                continue
            grid = grid_of(c, n, args.m)
            size = c[4] * (2 if c[7] else 1)
            active = max_active_clusters(c, grid)
            clusters = grid[0] * grid[1] * grid[2] // size
            waves = math.ceil(clusters / active) if active else float("inf")
            print(f"{n}x{k} | {cuda_large.kernel_name(*c)} | {'yes' if c == cfg else ''} | "
                  f"{grid[0] * grid[1] * grid[2]} | {size} | {active} | {active * size} | "
                  f"{waves}", flush=True)


if __name__ == "__main__":
    main()
