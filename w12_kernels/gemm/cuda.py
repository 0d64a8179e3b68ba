"""The CUDA C kernels of ``kernels.cu``: compiled once per device with NVRTC (through CuPy),
launched on PyTorch's current stream (so they work under CUDA-graph capture once compiled).

Why CUDA C beside Triton: Triton's matrix multiply takes its operands through shared memory
and a barrier on every K step, which kept the Triton decode-GEMM at about half of cuBLAS on
small M (docs/PERF_GEMM.md). Here each lane decodes its words straight into MMA fragment
registers and keeps several chunks of loads in flight.

``gemm_small`` handles M <= 64 (``NT = ceil(M / 8)`` activation n-tiles); ``decode`` writes the
exact BF16 weight for the large-M path (decode, then cuBLAS).
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import numpy as np
import torch

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


@functools.cache
def available() -> bool:
    """True when the kernels can run here: a CUDA GPU of compute capability >= 8.0 and CuPy."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    if torch.cuda.get_device_capability()[0] < 8:
        return False
    try:
        import cupy  # noqa: F401
    except Exception:  # ImportError, or a CuPy build that does not match the driver
        return False
    return True


def kernel_name(nt: int, depth: int, prefetch: bool, tiles: int = 1, min_blocks: int = 1,
                x_stages: int = 0, groups: int = 1, kw: int = 8, w_stages: int = 0,
                cluster: int = 1) -> str:
    """The instantiation; its launch bound is 8 warps with one group of up to 8 warps (any
    such kw), else exactly the ``kw * groups`` warps of the launch (so that the register cap is
    not lower than it needs to be); with ``cluster`` > 1 (``w12_gemm_small_cl``) that bound over
    ``cluster``, the warps of one of the cluster's blocks."""
    bound = max(8, kw) if groups == 1 else kw * groups
    args = (f"{nt}, {depth}, {'true' if prefetch else 'false'}, {tiles}, {min_blocks}, "
            f"{x_stages}, {groups}")
    if cluster == 1:
        return f"w12_gemm_small<{args}, {bound}, {w_stages}>"
    return f"w12_gemm_small_cl<{args}, {max(1, bound // cluster)}, {w_stages}, {cluster}>"


@functools.cache
def _source() -> str:
    return SOURCE_PATH.read_text()


@functools.cache
def _kernel(device_index: int, name: str):
    """One compiled kernel: each instantiation is its own NVRTC module, compiled on first use
    (a second or two; CuPy keeps the binary in its on-disk cache)."""
    import cupy

    major, minor = torch.cuda.get_device_capability(device_index)
    arch = f"sm_{major}{minor}"
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=_source(),
                                options=("--std=c++17", f"--gpu-architecture={arch}"),
                                name_expressions=[name])
        return module.get_function(name)


def _current_stream_ptr(index: int) -> int:
    """PyTorch's current stream of GPU ``index`` as a raw handle (the private call takes ~1 us
    against ~7 us for ``torch.cuda.current_stream``)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


_SLOTS = np.arange(32, dtype=np.uint64) * 8  # byte offsets of 8-byte argument slots


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id and a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@functools.cache
def pdl_supported(index: int) -> bool:
    """Programmatic dependent launch on GPU ``index``: Hopper (9.0) and later."""
    return torch.cuda.get_device_capability(index)[0] >= 9


@functools.cache
def driver() -> ctypes.CDLL:
    """The CUDA driver library, loaded once (for the calls CuPy does not wrap)."""
    return ctypes.CDLL("libcuda.so.1")


@functools.cache
def _launch_ex():
    fn = driver().cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def _pdl_attribute() -> _LaunchAttribute:
    """The programmatic-serialization attribute, kept for the life of the process."""
    attr = _LaunchAttribute()
    attr.id = _PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1  # programmaticStreamSerializationAllowed
    return attr


def _launch_pdl(fptr: int, grid3: tuple, block3: tuple, shared_mem: int, stream: int,
                params: int) -> None:
    # (a configuration per launch: the driver call releases the GIL, so a shared one could get
    # another thread's stream)
    cfg = _LaunchConfig(grid3, block3, shared_mem, stream, ctypes.pointer(_pdl_attribute()), 1)
    err = _launch_ex()(ctypes.byref(cfg), fptr, params, None)
    if err != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {err}")


def kernel_params(args: tuple) -> tuple[np.ndarray, tuple]:
    """The driver's ``kernelParams`` for ``args``: an array of pointers, one a parameter, and
    what they point into (keep it alive until the launch call returns; the driver copies the
    values then). Pointers and non-negative integers each go into an 8-byte slot, from whose
    start the kernel reads its 4 or 8 bytes (little-endian); a ``bytes`` argument is passed by
    value as those bytes (a parameter struct of that size, such as a tensor map)."""
    blobs = {i: np.frombuffer(a, dtype=np.uint8) for i, a in enumerate(args)
             if isinstance(a, bytes)}
    values = np.array([0 if i in blobs else a for i, a in enumerate(args)],
                      dtype=np.uint64)  # a negative integer raises here
    slots = values.ctypes.data + _SLOTS[: len(args)]
    for i, blob in blobs.items():
        slots[i] = blob.ctypes.data
    return slots, (values, blobs)


def launch(func, grid: tuple, block: tuple, args: tuple, device: torch.device,
           shared_mem: int = 0, pdl: bool = False) -> None:
    """``func`` on PyTorch's current stream of ``device`` through the driver's launch call,
    with CuPy's current device switched only when it is not already ``device``.

    ``args`` as ``kernel_params`` takes them: one array holds them all, so CuPy's per-argument
    conversion is skipped. (Measured against CuPy's own launch call: no clear difference in
    host time, docs/PERF_ENGINE.md, "Prefill"; what it removed is the stream object and device
    context CuPy's call needed per launch.) ``pdl``: launched with programmatic dependent
    launch (``cuLaunchKernelEx``) where the GPU has it, so that the grid may start while the
    kernel before it in the stream is finishing; the kernel must then run
    ``griddepcontrol.wait`` before it touches anything that kernel writes."""
    import cupy

    index = _index(device)
    slots, _keep = kernel_params(args)
    grid3 = (*grid, 1, 1)[:3]
    block3 = (*block, 1, 1)[:3]

    def run() -> None:
        fptr, stream = _function_ptr(func, index), _current_stream_ptr(index)
        if pdl and pdl_supported(index):
            _launch_pdl(fptr, grid3, block3, shared_mem, stream, slots.ctypes.data)
        else:
            cupy.cuda.driver.launchKernel(fptr, *grid3, *block3, shared_mem, stream,
                                          slots.ctypes.data, 0)

    if torch.cuda.current_device() == index:
        run()
    else:
        with cupy.cuda.Device(index):
            run()


_FUNCTIONS: dict[tuple[int, int], tuple] = {}


def _function_ptr(func, index: int) -> int:
    """The driver handle of CuPy kernel ``func`` (a ``RawKernel``, whose ``kernel`` is the
    function loaded on the current device) on GPU ``index``, looked up once."""
    hit = _FUNCTIONS.get((id(func), index))
    if hit is None:  # the entry keeps func alive, so its id is not reused
        hit = _FUNCTIONS[(id(func), index)] = (func, getattr(func, "kernel", func).ptr)
    return hit[1]


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def allow_shared_memory(func, smem: int) -> None:
    """Let ``func`` launch with ``smem`` bytes of dynamic shared memory: past 48 KiB, counting
    its static shared memory too, a kernel must opt in to more."""
    if smem + func.shared_size_bytes > 48 * 1024 and func.max_dynamic_shared_size_bytes < smem:
        func.max_dynamic_shared_size_bytes = smem


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


@functools.cache
def shared_memory_limit(index: int) -> int:
    """The shared memory a block may opt in to on GPU ``index`` (227 KiB on Hopper)."""
    props = torch.cuda.get_device_properties(index)
    return int(getattr(props, "shared_memory_per_block_optin", 227 * 1024))


def _padded_x(x: torch.Tensor, kp: int) -> torch.Tensor:
    """x as [M, Kp] with rows 16-byte aligned and zeros past K (the kernel reads whole chunks)."""
    m, k = x.shape
    if k == kp and x.stride(0) == kp and x.stride(1) == 1 and x.data_ptr() % 16 == 0:
        return x
    padded = torch.zeros((m, kp), dtype=x.dtype, device=x.device)
    padded[:, :k] = x
    return padded


def check_small(kw: int, depth: int, prefetch: bool = False, tiles: int = 1,
                min_blocks: int = 1, x_stages: int = 0, groups: int = 1,
                w_stages: int = 0, cluster: int = 1) -> None:
    """ValueError unless ``gemm_small`` has an instantiation of this schedule."""
    if (not 1 <= kw <= KW_MAX or depth < 1 or (prefetch and depth % 2) or tiles not in TILES
            or min_blocks not in MIN_BLOCKS or x_stages not in X_STAGES
            or (prefetch and x_stages) or groups not in GROUPS or kw * groups > 32
            or w_stages not in W_STAGES
            or (w_stages and (depth != 1 or prefetch or x_stages not in (0, w_stages)))
            or cluster not in CLUSTERS
            or (cluster > 1 and (kw % cluster or x_stages or w_stages))):
        raise ValueError(f"gemm_small: bad configuration kw={kw} depth={depth} "
                         f"prefetch={prefetch} tiles={tiles} min_blocks={min_blocks} "
                         f"x_stages={x_stages} groups={groups} w_stages={w_stages} "
                         f"cluster={cluster}")


def gemm_small(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor,
               esc_rowptr: torch.Tensor, esc_col: torch.Tensor, esc_delta: torch.Tensor,
               bias: torch.Tensor | None, n: int, k: int, *, kw: int, depth: int,
               prefetch: bool = False, tiles: int = 1, min_blocks: int = 1,
               x_stages: int = 0, groups: int = 1, w_stages: int = 0, cluster: int = 1,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for BF16 ``x [M, K]`` with ``M <= 64``.

    ``kw`` warps share each 16-row tile, warp ``w`` summing chunks ``w, w + kw, ...`` (a
    function of the weight shape only, for batch invariance); ``tiles`` 16-row tiles share one
    block, so each activation load serves ``tiles`` tiles (no sum changes with it); ``depth``
    chunk columns of loads stay in flight per warp; ``prefetch`` loads the next column's
    activations ahead into registers (``depth`` even); ``x_stages`` >= 2 instead streams
    them through that many shared-memory stages with cp.async; ``min_blocks`` caps the registers
    so that that many blocks (of 8 warps, or ``kw * groups`` where that is more) fit on a
    multiprocessor; ``groups`` puts that many groups of ``kw`` warps, each on its own ``tiles``
    tiles, in one block, so that the activations one group loads are in L1 for the others;
    ``w_stages`` >= 2 streams the weights through that many shared-memory stages with cp.async
    instead of the register ring (``depth`` 1, no ``prefetch``, ``x_stages`` 0 or the same
    count), so that the chunks in flight cost no registers; ``cluster`` > 1 spreads each
    tile group's ``kw`` warps over that many blocks of a thread-block cluster (``kw /
    cluster`` warps a block, the partial tiles added in warp order through distributed shared
    memory; no stages), so that smaller blocks fill the multiprocessors more evenly. None of
    these changes a sum.
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
    xp = _padded_x(x, nchunks * 64)
    func, smem = _small_kernel(_index(x.device), -(-m // 8), kw, depth, prefetch, tiles,
                               min_blocks, x_stages, groups, w_stages, cluster)
    args = (_ptr(chunks), _ptr(xp), _ptr(out), _ptr(scale), _ptr(esc_rowptr), _ptr(esc_col),
            _ptr(esc_delta), _ptr(bias), m, n, ntiles, nchunks, xp.stride(0), kw)
    launch(func, (-(-ntiles // (tiles * groups)) * cluster,), (kw // cluster * 32 * groups,),
           args, x.device, smem)
    return out


@functools.cache
def _small_kernel(index: int, nt: int, kw: int, depth: int, prefetch: bool, tiles: int,
                  min_blocks: int, x_stages: int, groups: int, w_stages: int,
                  cluster: int = 1):
    """The compiled instantiation of a schedule on GPU ``index`` and its shared memory, checked
    and allowed once (a call then costs only the launch)."""
    import cupy

    check_small(kw, depth, prefetch, tiles, min_blocks, x_stages, groups, w_stages, cluster)
    smem = small_shared_bytes(nt, kw, x_stages, groups, w_stages, tiles, cluster)
    if smem > shared_memory_limit(index):
        raise ValueError(f"gemm_small: kw={kw} groups={groups} x_stages={x_stages} "
                         f"w_stages={w_stages} tiles={tiles} need "
                         f"{smem} bytes of shared memory at {8 * nt} rows, over the "
                         f"{shared_memory_limit(index)} a block may have here")
    func = _kernel(index, kernel_name(nt, depth, prefetch, tiles, min_blocks, x_stages, groups,
                                      kw, w_stages, cluster))
    with cupy.cuda.Device(index):
        allow_shared_memory(func, smem)
    return func, smem


def decode(chunks: torch.Tensor, scale: torch.Tensor, esc_row: torch.Tensor,
           esc_col: torch.Tensor, esc_val: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The exact BF16 weight [N, K]: the decode kernel, then the escapes written in by a
    second kernel."""
    out = torch.empty((n, k), dtype=torch.bfloat16, device=chunks.device)
    tiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    total = tiles * nchunks
    device = chunks.device
    count = int(esc_col.numel())
    if total and n and k:
        sms = torch.cuda.get_device_properties(_index(device)).multi_processor_count
        blocks = max(1, min(math.ceil(total / 8), sms * 16))
        launch(_kernel(_index(device), "w12_decode"), (blocks,), (256,),
               (_ptr(chunks), _ptr(scale), _ptr(out), n, k, nchunks, total), device)
    if count:
        launch(_kernel(_index(device), "w12_write_escapes"),
               (max(1, min(math.ceil(count / 256), 1024)),), (256,),
               (_ptr(out), _ptr(esc_row), _ptr(esc_col), _ptr(esc_val), count, k), device)
    return out
