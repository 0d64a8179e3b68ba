"""The small-M W12 GEMM with its operands streamed through shared memory
(``kernels_stream.cu``), for Hopper.

``w12_gemm_small`` (``cuda.py``) keeps its next chunk in registers and reads the activations
from L2 in every warp; from 16 rows on it runs out of registers and warps to keep enough bytes
in flight (docs/PERF_GEMM.md #8, #12, #17). Here a producer warp bulk-copies whole column
groups (``kw`` chunk columns of the block's tiles, and the activation rows of those columns)
into ``stages`` shared-memory stages, and ``kw x groups`` consumer warps multiply them, each
activation column read by all of the block's tiles. The sums are ``w12_gemm_small``'s at the
same ``kw``, bit for bit (same column order per virtual warp, same MMAs, same fold and
epilogue), so the launcher may pick either per M class without breaking batch invariance.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import torch

from w12_kernels.gemm import cuda, cuda_large

SOURCE_PATH = Path(__file__).with_name("kernels_stream.cu")
KW = (2, 4, 8)  # the split of the shapes' table (w12_gemm_small's kw)
GROUPS = (1, 2, 3, 4)  # groups of consumer warps, each its own tiles
TILES = (1, 2, 3, 4)  # 16-row tiles per consumer warp
PRODUCERS = (1, 2, 4, 8)  # producer warps
MAX_WARPS = 32  # warps per block
SMEM_LIMIT = 227 * 1024


def available() -> bool:
    return cuda_large.available()


def kernel_name(nt: int, kw: int, groups: int, tiles: int, stages: int,
                producers: int = 1) -> str:
    return f"w12_stream_{nt}_{kw}_{groups}_{tiles}_{stages}_{producers}"


def threads(kw: int, groups: int, producers: int = 1) -> int:
    return 32 * (kw * groups + producers)


def shared_bytes(nt: int, kw: int, groups: int, tiles: int, stages: int) -> int:
    """``stages`` x (the chunk words of ``kw`` columns of ``groups * tiles`` tiles + ``8 nt``
    activation rows of them, 16 bytes of padding per row), the float32 partial tiles of a
    unit, a full and an empty mbarrier per stage (``StreamShape``)."""
    r = groups * tiles
    stage = r * kw * 1536 + 8 * nt * (128 * kw + 16)
    return stages * stage + r * kw * nt * 512 + 16 * stages


def max_stages(nt: int, kw: int, groups: int, tiles: int) -> int:
    """The most stages (at most 8) whose shared memory fits a block; 0 if not even 2 do."""
    fit = [s for s in range(2, 9) if shared_bytes(nt, kw, groups, tiles, s) <= SMEM_LIMIT]
    return max(fit, default=0)


def check_config(nt: int, kw: int, groups: int, tiles: int, stages: int,
                 producers: int = 1) -> None:
    if (not 1 <= nt <= cuda.NT_MAX or kw not in KW or groups not in GROUPS
            or tiles not in TILES or not 2 <= stages <= 8 or producers not in PRODUCERS
            or kw * groups + producers > MAX_WARPS
            or shared_bytes(nt, kw, groups, tiles, stages) > SMEM_LIMIT):
        raise ValueError(f"gemm_stream: bad configuration nt={nt} kw={kw} groups={groups} "
                         f"tiles={tiles} stages={stages} producers={producers}")


def _entry(nt: int, kw: int, groups: int, tiles: int, stages: int, producers: int) -> str:
    return (
        f'extern "C" __global__ void __launch_bounds__({threads(kw, groups, producers)})\n'
        f"{kernel_name(nt, kw, groups, tiles, stages, producers)}(\n"
        "    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x,\n"
        "    bf16_t* __restrict__ y, const float* __restrict__ scale,\n"
        "    const int* __restrict__ rowptr, const int* __restrict__ esc_col,\n"
        "    const float* __restrict__ esc_delta, const bf16_t* __restrict__ bias, int M, int N,\n"
        "    int ntiles, int nchunks, int ldx) {\n"
        f"  stream_body<{nt}, {kw}, {groups}, {tiles}, {stages}, {producers}>(\n"
        "      chunks, x, y, scale, rowptr, esc_col, esc_delta, bias, M, N, ntiles, nchunks,\n"
        "      ldx);\n}\n")


def source(nt: int, kw: int, groups: int, tiles: int, stages: int, producers: int = 1) -> str:
    """kernels.cu, kernels_large.cu (its helpers), kernels_stream.cu and one entry point."""
    return (cuda_large._base_source() + SOURCE_PATH.read_text() + "\n"
            + _entry(nt, kw, groups, tiles, stages, producers))


@functools.cache
def _function(device_index: int, config: tuple[int, ...]):
    import cupy

    major, minor = torch.cuda.get_device_capability(device_index)
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=source(*config),
                                options=("--std=c++17", f"--gpu-architecture=sm_{major}{minor}a"))
        return module.get_function(kernel_name(*config))


def blocks_per_sm(func, threads_: int, smem: int) -> int:
    """Blocks of ``func`` that fit a multiprocessor of an H100/H200 (228 KiB of shared memory,
    1 KiB of it reserved per block; 64 Ki registers, allocated per warp in units of 256;
    2048 threads), at least 1."""
    warp_regs = -(-func.num_regs * 32 // 256) * 256
    by_regs = 65536 // (warp_regs * (threads_ // 32))
    by_smem = 228 * 1024 // (smem + 1024)
    return max(1, min(by_regs, by_smem, 2048 // threads_))


def gemm_stream(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor,
                esc_rowptr: torch.Tensor, esc_col: torch.Tensor, esc_delta: torch.Tensor,
                bias: torch.Tensor | None, n: int, k: int, *, kw: int, groups: int = 1,
                tiles: int = 1, stages: int = 3, producers: int = 1,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for BF16 ``x [M, K]`` with ``M <= 64``, bit-equal to
    ``cuda.gemm_small`` at the same ``kw``: blocks of ``groups * tiles`` 16-row tiles,
    ``kw * groups`` consumer warps, ``stages`` shared-memory stages of ``kw`` chunk columns."""
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return out
    if m > 8 * cuda.NT_MAX:
        raise ValueError(f"gemm_stream takes at most {8 * cuda.NT_MAX} rows, got {m}")
    nt = math.ceil(m / 8)
    config = (nt, kw, groups, tiles, stages, producers)
    check_config(*config)
    ntiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    xp = cuda._padded_x(x, nchunks * 64)
    device = x.device
    func = _function(cuda._index(device), config)
    smem = shared_bytes(*config[:5])
    args = (cuda._ptr(chunks), cuda._ptr(xp), cuda._ptr(out), cuda._ptr(scale),
            cuda._ptr(esc_rowptr), cuda._ptr(esc_col), cuda._ptr(esc_delta), cuda._ptr(bias),
            np.int32(m), np.int32(n), np.int32(ntiles), np.int32(nchunks),
            np.int32(xp.stride(0)))
    nthreads = threads(kw, groups, producers)
    units = math.ceil(ntiles / (groups * tiles))
    resident = _sms(cuda._index(device)) * blocks_per_sm(func, nthreads, smem)
    with cuda._on(device):
        cuda.allow_shared_memory(func, smem)
        func((min(units, resident),), (nthreads,), args, shared_mem=smem)
    return out


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
