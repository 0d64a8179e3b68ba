"""The host side of the CUDA launches, on the CPU: the kernel parameter array of
``cuda.kernel_params`` and the tensor map request of the large-M kernel's weight stage
(``cuda_large._weight_map``), whose encoding itself needs the GPU driver."""

from __future__ import annotations

import ctypes

import pytest
import torch

from w12_kernels.gemm import cuda, cuda_large


def _read(address: int, size: int) -> bytes:
    return ctypes.string_at(int(address), size)


def test_kernel_params_slots_and_by_value_bytes():
    blob = bytes(range(128))
    args = (0x1122334455667788, 7, blob, 3)
    slots, _keep = cuda.kernel_params(args)
    assert len(slots) == 4
    assert _read(slots[0], 8) == (0x1122334455667788).to_bytes(8, "little")
    assert _read(slots[1], 4) == (7).to_bytes(4, "little")  # an int parameter reads 4 bytes
    assert _read(slots[2], 128) == blob  # passed by value: the slot points at the bytes
    assert _read(slots[3], 8) == (3).to_bytes(8, "little")


def test_kernel_params_refuse_negative_integers():
    with pytest.raises(OverflowError):
        cuda.kernel_params((1, -1))


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
