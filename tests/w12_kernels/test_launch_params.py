"""The host side of the CUDA launches, on the CPU: the kernel parameter array of
``runtime.kernel_params``, the shared-memory opt-in, the headers' digest in the compiled
source, and the tensor map request of the large-M kernel's weight stage
(``large.launcher._weight_map``), whose encoding itself needs the GPU driver."""

from __future__ import annotations

import ctypes

import pytest
import torch

from w12_kernels.gemm.cuda import runtime
from w12_kernels.gemm.large import launcher as cuda_large


def _read(address: int, size: int) -> bytes:
    return ctypes.string_at(int(address), size)


def test_kernel_params_slots_and_by_value_bytes():
    blob = bytes(range(128))
    args = (0x1122334455667788, 7, blob, 3)
    slots, _keep = runtime.kernel_params(args)
    assert len(slots) == 4
    assert _read(slots[0], 8) == (0x1122334455667788).to_bytes(8, "little")
    assert _read(slots[1], 4) == (7).to_bytes(4, "little")  # an int parameter reads 4 bytes
    assert _read(slots[2], 128) == blob  # passed by value: the slot points at the bytes
    assert _read(slots[3], 8) == (3).to_bytes(8, "little")


def test_kernel_params_refuse_negative_integers():
    with pytest.raises(OverflowError):
        runtime.kernel_params((1, -1))


def test_weight_map_box_is_one_column_of_the_blocks_tiles(monkeypatch):
    """The map covers the chunks as 8-byte words (192 a chunk x columns x tiles, strides of one
    chunk and one tile row of chunks), its box one chunk column of the block's tiles; it is
    encoded once per address, shape and box."""
    calls = []

    def fake_encode(address, dims, strides, box):
        calls.append((address, dims, strides, box))
        return bytes(128)

    monkeypatch.setattr(cuda_large, "_encode_tiled", fake_encode)
    monkeypatch.setattr(cuda_large, "_MAPS", {})
    chunks = torch.zeros(19, 7, 384, dtype=torch.int32)
    assert cuda_large._weight_map(chunks, 8) == bytes(128)
    assert calls == [(chunks.data_ptr(), (192, 7, 19), (1536, 7 * 1536), (192, 1, 8))]
    cuda_large._weight_map(chunks, 8)
    assert len(calls) == 1  # cached
    cuda_large._weight_map(chunks, 4)
    assert calls[-1][3] == (192, 1, 4)
    with pytest.raises(ValueError, match="contiguous"):
        cuda_large._weight_map(torch.zeros(7, 19, 384, dtype=torch.int32).transpose(0, 1), 8)


def test_shared_memory_opt_in_counts_static_bytes():
    """A kernel asks for more dynamic shared memory once dynamic + static bytes pass 48 KiB (a
    48 KiB request with 16 static bytes fails to launch without it: the default limit is 48 KiB
    less the static bytes), and never lowers a larger limit it already has."""
    from types import SimpleNamespace

    func = SimpleNamespace(shared_size_bytes=16, max_dynamic_shared_size_bytes=48 * 1024 - 16)
    runtime.allow_shared_memory(func, 48 * 1024 - 16)  # fits the default: nothing to ask
    assert func.max_dynamic_shared_size_bytes == 48 * 1024 - 16
    runtime.allow_shared_memory(func, 48 * 1024)
    assert func.max_dynamic_shared_size_bytes == 48 * 1024
    runtime.allow_shared_memory(func, 100 * 1024)
    assert func.max_dynamic_shared_size_bytes == 100 * 1024
    runtime.allow_shared_memory(func, 60 * 1024)
    assert func.max_dynamic_shared_size_bytes == 100 * 1024


def test_compiled_source_names_the_headers_it_includes(monkeypatch, tmp_path):
    """CuPy caches a module by its source text and options: the headers' digest goes into the
    source, so that a changed header is compiled afresh; the headers' folder is on NVRTC's
    include path."""
    import sys
    import types

    seen = []

    class RawModule:
        def __init__(self, code, options, name_expressions):
            seen.append((code, options, name_expressions))

    class Device:
        def __init__(self, index):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    fake = types.SimpleNamespace(RawModule=RawModule, cuda=types.SimpleNamespace(Device=Device))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    runtime.module(0, '#include "common.cuh"\n', arch_suffix="a", name_expressions=("f",))
    code, options, names = seen[-1]
    assert code.startswith(f"// shared headers {runtime.headers_digest()}\n")
    assert f"--include-path={runtime.INCLUDE_DIR}" in options
    assert "--gpu-architecture=sm_90a" in options and names == ["f"]
    header = tmp_path / "common.cuh"
    header.write_text("// one\n")
    monkeypatch.setattr(runtime, "INCLUDE_DIR", tmp_path)
    runtime.headers_digest.cache_clear()
    first = runtime.headers_digest()
    header.write_text("// two\n")
    runtime.headers_digest.cache_clear()
    assert runtime.headers_digest() != first
    runtime.headers_digest.cache_clear()
