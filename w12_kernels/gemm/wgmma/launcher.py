"""The small-M W12 GEMM on Hopper's warpgroup MMA (``kernels.cu``), with the bits of the mma.sync
kernel (``small/``) for the same K split, so that batch invariance holds across the two.

The mma.sync kernel re-reads the activations for every 16-row tile and keeps them and their
accumulators in registers, which limits it above 32 rows; here the tensor cores read one
activation stage per 64 weight rows from shared memory, weights and activations arrive by bulk
copies, and no MMA warp waits on a global load. ``w12_linear`` runs it where the table's layout
for the shape and class of M names a schedule (``table.Layout.wg``): on the H200 that is the
33-64-row class of some large layers, where it runs 1.04-1.4x faster than the mma.sync kernel;
at 1-32 rows the mma.sync kernel stays faster or as fast. With 128-row blocks it takes 65..128
rows in one pass over the weight with the bits of two 64-row passes
(``SmallConfig.one_pass``). Compute capability 9.0 (``sm_90a``) only.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from w12_kernels.gemm.cuda import runtime

SOURCE_PATH = Path(__file__).with_name("kernels.cu")
N_BLOCKS = (16, 32, 48, 64, 128)  # activation rows per block (wgmma N; 128: 65..128 rows in
# one pass; a set is then 64 registers a thread: at most two sets (four spill), and sets x
# warpgroups x row groups at most 4 (two sets in 544 threads fail to allocate))
WARPGROUPS = (1, 2, 4)  # warpgroups per block
SETS = (1, 2, 4)  # accumulator sets per warpgroup (kw / warpgroups)
DEPTHS = (4, 6, 8)  # stages (columns of weights and activations) per warpgroup
ROW_GROUPS = (1, 2)  # 64-row groups per block (sharing each activation stage)
SPLITS = (1, 2, 4, 8)  # blocks sharing a row range's K (partial sums folded by the last)


def available() -> bool:
    return runtime.available() and torch.cuda.get_device_capability()[0] == 9


def kernel_name(n_block: int, depth: int, warpgroups: int, sets: int, row_groups: int) -> str:
    return f"w12_gemm_wg<{n_block}, {depth}, {warpgroups}, {sets}, {row_groups}>"


@functools.cache
def _kernel(device_index: int, name: str):
    module = runtime.module(device_index, SOURCE_PATH.read_text(), arch_suffix="a",
                            name_expressions=(name,))
    return module.get_function(name)


def check(kw: int, depth: int, n_block: int, warpgroups: int, row_groups: int = 1,
          split: int = 1) -> int:
    """The accumulator sets per warpgroup (``kw / (warpgroups x split)``); ValueError unless
    the kernel has an instantiation of this schedule."""
    per_block = warpgroups * split
    sets = kw // per_block if kw % per_block == 0 else 0
    if (sets not in SETS or depth not in DEPTHS or n_block not in N_BLOCKS
            or (n_block == 128 and (sets > 2 or sets * warpgroups * row_groups > 4))
            or warpgroups not in WARPGROUPS or row_groups not in ROW_GROUPS
            or split not in SPLITS or warpgroups * row_groups > 4):
        raise ValueError(f"gemm_wg: bad configuration kw={kw} depth={depth} "
                         f"n_block={n_block} warpgroups={warpgroups} row_groups={row_groups} "
                         f"split={split}")
    return sets


def shared_bytes(n_block: int, warpgroups: int, depth: int, row_groups: int = 1) -> int:
    """512 bytes of mbarriers, then ``depth`` stages per warpgroup (a column's activations,
    n_block x 128 bytes, and the chunks of its ``4 x row_groups`` tiles, 1536 bytes each),
    reused by the fold's [warpgroups][64 row_groups][n_block] float32 slots."""
    return 512 + warpgroups * depth * (n_block * 128 + row_groups * 4 * 1536)


def default_warpgroups(kw: int) -> int:
    return min(kw, max(WARPGROUPS))


_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # never freed: a captured graph may still use one


def _counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 arrival counters for the K-split fold, one set per device and stream (the
    last block of each row range puts its counter back to zero, so a set is reused). A set
    that is too small is replaced by a larger one and kept alive, never freed: CUDA graphs
    captured with it go on using it."""
    index = runtime.device_index(device)
    key = (index, runtime.current_stream_ptr(index))
    have = _COUNTERS.get(key)
    if have is None or have.numel() < count:
        runtime.check_not_capturing("W12 GEMM K-split counters")
        if have is not None:
            _OUTGROWN.append(have)
        size = max(count, 4096, 0 if have is None else 2 * have.numel())
        have = _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return have


def gemm_wg(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor,
            esc_rowptr: torch.Tensor, esc_col: torch.Tensor, esc_delta: torch.Tensor,
            bias: torch.Tensor | None, n: int, k: int, *, kw: int, depth: int = 4,
            n_block: int | None = None, warpgroups: int | None = None, row_groups: int = 1,
            split: int = 1, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for BF16 ``x [M, K]``, any M (each block of ``n_block`` rows, by
    default M rounded up to 16 and at most 64, reads the whole weight; 128 takes 65..128 rows in
    one pass): blocks of
    ``64 row_groups`` weight rows, ``warpgroups`` MMA warpgroups per row group (default
    ``min(kw, 4)``) and ``split`` blocks per row range (grid z), the chunk columns split into
    ``kw`` partial sums as ``gemm_small``'s warps split them and added in the same order (in
    the block, or with ``split`` > 1 by the row range's last block from a float32 workspace),
    so the bits equal ``gemm_small``'s with the same ``kw``; ``depth`` stages of weights and
    activations per warpgroup."""
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return out
    if n_block is None:
        n_block = min(64, 16 * math.ceil(m / 16))
    if warpgroups is None:
        warpgroups = default_warpgroups(kw)
    ntiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    xp = runtime.padded_x(x, nchunks * 64)
    index = runtime.device_index(x.device)
    func, smem = _wg_kernel(index, kw, depth, n_block, warpgroups, row_groups, split)
    tblocks = math.ceil(m / n_block)
    rblocks = math.ceil(ntiles / (4 * row_groups))
    image = torch.empty(tblocks * nchunks * n_block * 64, dtype=torch.bfloat16, device=x.device)
    ptr = runtime.ptr
    runtime.launch(_kernel(index, f"w12_x_image<{n_block}>"), (nchunks, tblocks),
                   (4 * n_block,), (ptr(xp), ptr(image), m, xp.stride(0), nchunks), x.device)
    ws = counters = None
    if split > 1:
        ws = torch.empty(tblocks * kw * rblocks * 64 * row_groups * n_block,
                         dtype=torch.float32, device=x.device)
        counters = _counters(x.device, rblocks * tblocks)
    args = (ptr(chunks), ptr(xp), ptr(out), ptr(scale), ptr(esc_rowptr), ptr(esc_col),
            ptr(esc_delta), ptr(bias), ptr(image), ptr(ws), ptr(counters), m, n, ntiles,
            nchunks, xp.stride(0))
    runtime.launch(func, (rblocks, tblocks, split), (128 * warpgroups * row_groups + 32,), args,
                   x.device, smem)
    return out


@functools.cache
def _wg_kernel(index: int, kw: int, depth: int, n_block: int, warpgroups: int, row_groups: int,
               split: int):
    """The compiled instantiation and its shared memory, checked and allowed once."""
    import cupy

    sets = check(kw, depth, n_block, warpgroups, row_groups, split)
    smem = shared_bytes(n_block, warpgroups, depth, row_groups)
    if smem > runtime.shared_memory_limit(index):
        raise ValueError(f"gemm_wg: {warpgroups} x {row_groups} warpgroups x {depth} stages of "
                         f"{n_block} rows need {smem} bytes of shared memory, over the "
                         f"{runtime.shared_memory_limit(index)} a block may have here")
    func = _kernel(index, kernel_name(n_block, depth, warpgroups, sets, row_groups))
    with cupy.cuda.Device(index):
        runtime.allow_shared_memory(func, smem)
    return func, smem
