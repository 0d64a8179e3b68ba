"""What the CUDA C kernels share on the host: NVRTC compilation with the shared headers of this
folder on the include path (through CuPy), and the launch on PyTorch's current stream (so the
kernels work under CUDA-graph capture once compiled), with programmatic dependent launch where
a kernel asks for it.

A kernel source includes ``common.cuh`` (and ``wgmma.cuh``) by name; ``module`` passes this
folder as the include path. CuPy caches a compiled module by its source text and options, not
by what the source includes, so ``module`` puts a digest of the headers into the source text:
a header change then compiles afresh.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import warnings
from pathlib import Path

import numpy as np
import torch

INCLUDE_DIR = Path(__file__).parent

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

@functools.cache
def headers_digest() -> str:
    """A digest of the shared headers (``*.cuh`` of this folder)."""
    digest = hashlib.sha256()
    for header in sorted(INCLUDE_DIR.glob("*.cuh")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    return digest.hexdigest()[:16]


def compile_options(index: int, arch_suffix: str = "") -> tuple[str, ...]:
    """NVRTC's options for GPU ``index``: C++17, its architecture (``arch_suffix`` "a": the
    architecture-specific features, such as Hopper's warpgroup MMA) and the headers' folder."""
    major, minor = torch.cuda.get_device_capability(index)
    return ("--std=c++17", f"--gpu-architecture=sm_{major}{minor}{arch_suffix}",
            f"--include-path={INCLUDE_DIR}")


def module(index: int, code: str, arch_suffix: str = "",
           name_expressions: tuple[str, ...] = ()):
    """``code`` compiled for GPU ``index`` (a CuPy ``RawModule``; CuPy keeps the binary in its
    on-disk cache). ``name_expressions``: template instantiations to compile and name."""
    import cupy

    with cupy.cuda.Device(index):
        return cupy.RawModule(code=f"// shared headers {headers_digest()}\n{code}",
                              options=compile_options(index, arch_suffix),
                              name_expressions=list(name_expressions) or None)


def check_not_capturing(what: str) -> None:
    """Warn when zero-started per-stream state (``what``) is being created inside a CUDA graph
    capture: its zero fill is then a node of that graph, run only when that graph replays, and
    another graph captured later on the same stream would start from whatever memory it holds.
    Capturing on the stream that ran the calls once before (``torch.cuda.graph(g,
    stream=...)``) creates it eagerly instead."""
    if torch.cuda.is_current_stream_capturing():
        warnings.warn(f"{what} created during CUDA graph capture; run the captured calls once "
                      "on the capture stream before capturing", RuntimeWarning, stacklevel=3)


def current_stream_ptr(index: int) -> int:
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
    conversion is skipped (against CuPy's own launch call: no clear difference in host time;
    what it saves is the stream object and device context CuPy's call needs per launch).
    ``pdl``: launched with programmatic dependent
    launch (``cuLaunchKernelEx``) where the GPU has it, so that the grid may start while the
    kernel before it in the stream is finishing; the kernel must then run
    ``griddepcontrol.wait`` before it touches anything that kernel writes."""
    import cupy

    index = device_index(device)
    slots, _keep = kernel_params(args)
    grid3 = (*grid, 1, 1)[:3]
    block3 = (*block, 1, 1)[:3]

    def run() -> None:
        fptr, stream = _function_ptr(func, index), current_stream_ptr(index)
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


def ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def allow_shared_memory(func, smem: int) -> None:
    """Let ``func`` launch with ``smem`` bytes of dynamic shared memory: past 48 KiB, counting
    its static shared memory too, a kernel must opt in to more."""
    if smem + func.shared_size_bytes > 48 * 1024 and func.max_dynamic_shared_size_bytes < smem:
        func.max_dynamic_shared_size_bytes = smem


@functools.cache
def shared_memory_limit(index: int) -> int:
    """The shared memory a block may opt in to on GPU ``index`` (227 KiB on Hopper)."""
    props = torch.cuda.get_device_properties(index)
    return int(getattr(props, "shared_memory_per_block_optin", 227 * 1024))


def padded_x(x: torch.Tensor, kp: int) -> torch.Tensor:
    """x as [M, Kp] with rows 16-byte aligned and zeros past K (the kernel reads whole chunks)."""
    m, k = x.shape
    if k == kp and x.stride(0) == kp and x.stride(1) == 1 and x.data_ptr() % 16 == 0:
        return x
    padded = torch.zeros((m, kp), dtype=x.dtype, device=x.device)
    padded[:, :k] = x
    return padded

