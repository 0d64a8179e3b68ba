"""EXPERIMENTAL: the W12 GEMM on Hopper's warpgroup MMA (``kernels_wgmma.cu``).

Not used by ``w12_linear``. The mma.sync kernel of ``kernels.cu`` re-reads the activations for
every 16-row tile and keeps them and their accumulators in registers, which limits it at
M >= 16 (docs/PERF_GEMM.md); here 64 weight rows (a warpgroup) share one activation tile in
shared memory and the tensor cores read it from there. ``benchmarks/wgmma_probe.py`` checks it
against float64 and against the mma.sync kernel and times it on the GPU. Measured on an H200
(docs/PERF_GEMM.md, run 18): correct, the same bits as the mma.sync kernel at every M <= 64,
but 0.53x of cuBLAS at M = 32 (the mma.sync kernel: 1.0x), limited by its per-column latency;
so it stays out of the launcher. It needs compute capability 9.0 (``sm_90a``).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from w12_kernels.gemm import cuda

SOURCE_PATH = Path(__file__).with_name("kernels_wgmma.cu")
N_BLOCKS = (16, 32, 48, 64, 80, 96, 112, 128)  # activation rows per block (wgmma N)


def available() -> bool:
    return cuda.available() and torch.cuda.get_device_capability()[0] == 9


def wrapper(n: int, struct: str = "Wgmma", *, a_shared: bool = False) -> str:
    """``<struct><n>::mma(d, a, desc)``: d[n/2] += A(regs) x B(desc), m64nNk16, bf16 -> f32;
    with ``a_shared`` ``mma(d, desc_a, desc_b)``, both operands from shared memory (K-major).
    ``struct`` names the template, declared by whoever includes it."""
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    if a_shared:
        params, ins = "unsigned long long da, unsigned long long db", '"l"(da), "l"(db)'
        operands, imm, pred = f"%{regs}, %{regs + 1}", "1, 1, 0, 0", regs + 2
    else:
        params = "const u32 (&a)[4], unsigned long long desc"
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)'
        a = ", ".join(f"%{regs + i}" for i in range(4))
        operands, imm, pred = f"{{{a}}}, %{regs + 4}", "1, 1, 0", regs + 5
    return (
        f"template <> struct {struct}<{n}> {{\n"
        f"  __device__ __forceinline__ static void mma(float (&d)[{regs}], {params}) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{pred}, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "\n'
        f'                 "{{{d}}}, {operands}, p, {imm};\\n}}\\n"\n'
        f"                 : {outs}\n"
        f'                 : {ins}, "r"(1)\n'
        f'                 : "memory");\n'
        f"  }}\n}};\n"
    )


@functools.cache
def source() -> str:
    """kernels.cu (loads, decode8, conversions), the wrappers, then kernels_wgmma.cu."""
    wrappers = "template <int N> struct Wgmma;\n" + "".join(wrapper(n) for n in N_BLOCKS)
    return cuda.SOURCE_PATH.read_text() + "\n" + wrappers + "\n" + SOURCE_PATH.read_text()


def kernel_name(n_block: int, depth: int) -> str:
    return f"w12_gemm_wg<{n_block}, {depth}>"


@functools.cache
def _kernel(device_index: int, name: str):
    import cupy

    major, minor = torch.cuda.get_device_capability(device_index)
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=source(),
                                options=("--std=c++17", f"--gpu-architecture=sm_{major}{minor}a"),
                                name_expressions=[name])
        return module.get_function(name)


def gemm_wg(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor,
            esc_rowptr: torch.Tensor, esc_col: torch.Tensor, esc_delta: torch.Tensor,
            bias: torch.Tensor | None, n: int, k: int, *, kw: int, depth: int = 2,
            n_block: int | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for BF16 ``x [M, K]``, any M: blocks of 64 weight rows x
    ``n_block`` activation rows (default: M rounded up to 16, at most 128), ``kw``
    warpgroups per block splitting the chunk columns as ``gemm_small``'s warps do."""
    m = x.shape[0]
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return out
    if n_block is None:
        n_block = min(128, 16 * math.ceil(m / 16))
    if n_block not in N_BLOCKS or kw not in (1, 2) or depth < 1:
        raise ValueError(f"gemm_wg: bad configuration n_block={n_block} kw={kw} depth={depth}")
    ntiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    xp = cuda._padded_x(x, nchunks * 64)
    device = x.device
    func = _kernel(cuda._index(device), kernel_name(n_block, depth))
    smem = max(kw * 2 * n_block * 128, kw * 64 * n_block * 4)
    args = (cuda._ptr(chunks), cuda._ptr(xp), cuda._ptr(out), cuda._ptr(scale),
            cuda._ptr(esc_rowptr), cuda._ptr(esc_col), cuda._ptr(esc_delta), cuda._ptr(bias),
            m, n, ntiles, nchunks, xp.stride(0), kw)
    import cupy

    with cupy.cuda.Device(cuda._index(device)):
        cuda.allow_shared_memory(func, smem)
    cuda.launch(func, (math.ceil(ntiles / 4), math.ceil(m / n_block)), (128 * kw,), args,
                device, smem)
    return out
