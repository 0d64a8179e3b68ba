"""The packed weight decoded to the exact BF16 [N, K] on the GPU by the CUDA decode kernel
(``kernels.cu``), then its escapes written in by a second kernel: what the large-M rows run
where no GEMM kernel takes them (decode, then cuBLAS)."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from w12_kernels.gemm.cuda import runtime

SOURCE_PATH = Path(__file__).with_name("kernels.cu")


@functools.cache
def _kernel(device_index: int, name: str):
    module = runtime.module(device_index, SOURCE_PATH.read_text(), name_expressions=(name,))
    return module.get_function(name)


def decode(chunks: torch.Tensor, scale: torch.Tensor, esc_row: torch.Tensor,
           esc_col: torch.Tensor, esc_val: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The exact BF16 weight [N, K]: the decode kernel, then the escapes written in."""
    out = torch.empty((n, k), dtype=torch.bfloat16, device=chunks.device)
    tiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    total = tiles * nchunks
    device = chunks.device
    index = runtime.device_index(device)
    count = int(esc_col.numel())
    ptr = runtime.ptr
    if total and n and k:
        sms = torch.cuda.get_device_properties(index).multi_processor_count
        blocks = max(1, min(math.ceil(total / 8), sms * 16))
        runtime.launch(_kernel(index, "w12_decode"), (blocks,), (256,),
                       (ptr(chunks), ptr(scale), ptr(out), n, k, nchunks, total), device)
    if count:
        runtime.launch(_kernel(index, "w12_write_escapes"),
                       (max(1, min(math.ceil(count / 256), 1024)),), (256,),
                       (ptr(out), ptr(esc_row), ptr(esc_col), ptr(esc_val), count, k), device)
    return out
