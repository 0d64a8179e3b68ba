"""The small-M W12 GEMM on mma.sync (``kernels.cu``): M <= 64 activation rows, one K split per
weight shape, so that an output row's bits do not depend on M.

Each lane decodes its words straight into MMA fragment registers and keeps several chunks of
loads in flight; nothing goes through shared memory on the way to the tensor cores (Triton's
matrix multiply takes its operands through shared memory and a barrier on every K step, which
keeps a Triton decode-GEMM at about half of cuBLAS at small M). ``gemm_small`` checks a
schedule, compiles its instantiation once per GPU (NVRTC, ``cuda.runtime``) and launches it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from w12_kernels.gemm.cuda import runtime

SOURCE_PATH = Path(__file__).with_name("kernels.cu")
NT_MAX = 8  # 8 activation rows per n-tile: M <= 64
KW_MAX = 16  # warps sharing a 16-row tile (a block holds kw x groups <= 32 warps)
TILES = (1, 2, 3, 4)  # 16-row tiles per block
MIN_BLOCKS = (1, 2, 3, 4, 6, 8)  # blocks (of max(8, kw x groups) warps, over ``cluster``) per
# SM the registers allow
X_STAGES = (0, 2, 3, 4, 6)  # shared-memory activation stages (0: activations through registers)
GROUPS = (1, 2, 3, 4)  # groups of kw warps per block, each on its own tiles
W_STAGES = (0, 2, 3, 4, 6)  # shared-memory weight stages (0: the register ring of `depth`)
CLUSTERS = (1, 2, 4)  # blocks of a thread-block cluster sharing a tile group's kw warps


def kernel_name(nt: int, depth: int, tiles: int = 1, min_blocks: int = 1, x_stages: int = 0,
                groups: int = 1, kw: int = 8, w_stages: int = 0, cluster: int = 1) -> str:
    """The instantiation; its launch bound is 8 warps with one group of up to 8 warps (any
    such kw), else exactly the ``kw * groups`` warps of the launch (so that the register cap is
    not lower than it needs to be); with ``cluster`` > 1 (``w12_gemm_small_cl``) that bound over
    ``cluster``, the warps of one of the cluster's blocks."""
    bound = max(8, kw) if groups == 1 else kw * groups
    args = f"{nt}, {depth}, {tiles}, {min_blocks}, {x_stages}, {groups}"
    if cluster == 1:
        return f"w12_gemm_small<{args}, {bound}, {w_stages}>"
    return f"w12_gemm_small_cl<{args}, {max(1, bound // cluster)}, {w_stages}, {cluster}>"


@functools.cache
def _kernel(device_index: int, name: str):
    """One compiled kernel: each instantiation is its own NVRTC module, compiled on first use
    (a second or two; CuPy keeps the binary in its on-disk cache)."""
    module = runtime.module(device_index, SOURCE_PATH.read_text(), name_expressions=(name,))
    return module.get_function(name)


def small_shared_bytes(nt: int, kw: int, x_stages: int = 0, groups: int = 1,
                       w_stages: int = 0, tiles: int = 1, cluster: int = 1) -> int:
    """``w12_gemm_small``'s dynamic shared memory: each group's kw partial tiles (at most
    32 KiB a group), then each warp's activation stages (1 KiB per n-tile and stage), then
    each warp's weight stages (1.5 KiB per tile and stage), then the epilogue's eight words per
    output row of the block (512 bytes per 16-row tile). With ``cluster`` > 1 (no stages) one
    block's: the partial tiles of all kw warps of the cluster for every tile at once, then the
    epilogue's rows."""
    if cluster > 1:
        return groups * tiles * kw * nt * 4 * 32 * 4 + groups * tiles * 512
    return (groups * kw * (nt * 4 * 32 * 4 + x_stages * nt * 1024 + w_stages * tiles * 1536)
            + groups * tiles * 512)


def check_small(kw: int, depth: int, tiles: int = 1, min_blocks: int = 1, x_stages: int = 0,
                groups: int = 1, w_stages: int = 0, cluster: int = 1) -> None:
    """ValueError unless ``gemm_small`` has an instantiation of this schedule."""
    if (not 1 <= kw <= KW_MAX or depth < 1 or tiles not in TILES
            or min_blocks not in MIN_BLOCKS or x_stages not in X_STAGES
            or groups not in GROUPS or kw * groups > 32 or w_stages not in W_STAGES
            or (w_stages and (depth != 1 or x_stages not in (0, w_stages)))
            or cluster not in CLUSTERS
            or (cluster > 1 and (kw % cluster or x_stages or w_stages))):
        raise ValueError(f"gemm_small: bad configuration kw={kw} depth={depth} "
                         f"tiles={tiles} min_blocks={min_blocks} x_stages={x_stages} "
                         f"groups={groups} w_stages={w_stages} cluster={cluster}")


def gemm_small(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor,
               esc_rowptr: torch.Tensor, esc_col: torch.Tensor, esc_delta: torch.Tensor,
               bias: torch.Tensor | None, n: int, k: int, *, kw: int, depth: int,
               tiles: int = 1, min_blocks: int = 1, x_stages: int = 0, groups: int = 1,
               w_stages: int = 0, cluster: int = 1,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for BF16 ``x [M, K]`` with ``M <= 64``.

    ``kw`` warps share each 16-row tile, warp ``w`` summing chunks ``w, w + kw, ...`` (a
    function of the weight shape only, for batch invariance); ``tiles`` 16-row tiles share one
    block, so each activation load serves ``tiles`` tiles (no sum changes with it); ``depth``
    chunk columns of loads stay in flight per warp; ``x_stages`` >= 2 streams the activations
    through that many shared-memory stages with cp.async (0: loaded into registers just before
    use); ``min_blocks`` caps the registers so that that many blocks (of 8 warps, or
    ``kw * groups`` where that is more) fit on a multiprocessor; ``groups`` puts that many
    groups of ``kw`` warps, each on its own ``tiles`` tiles, in one block, so that the
    activations one group loads are in L1 for the others; ``w_stages`` >= 2 streams the
    weights through that many shared-memory stages with cp.async instead of the register ring
    (``depth`` 1, ``x_stages`` 0 or the same count), so that the chunks in flight cost no
    registers; ``cluster`` > 1 spreads each tile group's ``kw`` warps over that many blocks of
    a thread-block cluster (``kw / cluster`` warps a block, the partial tiles added in warp
    order through distributed shared memory; no stages), so that smaller blocks fill the
    multiprocessors more evenly. None of these changes a sum.
    """
    m = x.shape[0]
    if m > 8 * NT_MAX:
        raise ValueError(f"gemm_small takes at most {8 * NT_MAX} rows, got {m}")
    ntiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    # (checked before padding x, whose padded rows' stride is nchunks * 64, and before the
    # output is allocated)
    if ntiles * nchunks * 96 >= 2**32 or 64 * nchunks * 64 >= 2**31 or 64 * n >= 2**32:
        raise ValueError("gemm_small: the weight (over 64 GiB), the activation rows or the "
                         "output rows are too large for the kernel's 32-bit offsets")
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return out
    xp = runtime.padded_x(x, nchunks * 64)
    func, smem = _small_kernel(runtime.device_index(x.device), -(-m // 8), kw, depth, tiles,
                               min_blocks, x_stages, groups, w_stages, cluster)
    ptr = runtime.ptr
    args = (ptr(chunks), ptr(xp), ptr(out), ptr(scale), ptr(esc_rowptr), ptr(esc_col),
            ptr(esc_delta), ptr(bias), m, n, ntiles, nchunks, xp.stride(0), kw)
    runtime.launch(func, (-(-ntiles // (tiles * groups)) * cluster,),
                   (kw // cluster * 32 * groups,), args, x.device, smem)
    return out


@functools.cache
def _small_kernel(index: int, nt: int, kw: int, depth: int, tiles: int, min_blocks: int,
                  x_stages: int, groups: int, w_stages: int, cluster: int = 1):
    """The compiled instantiation of a schedule on GPU ``index`` and its shared memory, checked
    and allowed once (a call then costs only the launch)."""
    import cupy

    check_small(kw, depth, tiles, min_blocks, x_stages, groups, w_stages, cluster)
    smem = small_shared_bytes(nt, kw, x_stages, groups, w_stages, tiles, cluster)
    limit = runtime.shared_memory_limit(index)
    if smem > limit:
        raise ValueError(f"gemm_small: kw={kw} groups={groups} x_stages={x_stages} "
                         f"w_stages={w_stages} tiles={tiles} need {smem} bytes of shared "
                         f"memory at {8 * nt} rows, over the {limit} a block may have here")
    func = _kernel(index, kernel_name(nt, depth, tiles, min_blocks, x_stages, groups, kw,
                                      w_stages, cluster))
    with cupy.cuda.Device(index):
        runtime.allow_shared_memory(func, smem)
    return func, smem
