"""The op's GPU path: pick the backend and the configuration, then launch.

Up to ``SMALL_M_MAX`` rows the decode-GEMM runs straight from the chunks (CUDA C kernels when
CuPy can compile them, the Triton kernels otherwise), with one configuration per weight shape.
Above that the weight is decoded to BF16 and cuBLAS multiplies (docs/PERF_GEMM.md: a fused
large-M kernel is future work).
"""

from __future__ import annotations

import functools

import torch

from w12_kernels.gemm import config as cfgs
from w12_kernels.gemm import cuda


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def small_config(n: int, k: int, device: torch.device) -> cfgs.SmallConfig:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return cfgs.small_config(n, k, _num_sms(index))


def backend() -> str:
    """``"cuda"`` (NVRTC kernels), ``"triton"``, or ``"torch"`` (decode in torch + F.linear)."""
    if cuda.available():
        return "cuda"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"


def decode(chunks, scale, e0, esc_rowptr, esc_row, esc_col, esc_val, n, k) -> torch.Tensor:
    """The exact BF16 weight [N, K] on the GPU."""
    kind = backend()
    if kind == "cuda":
        return cuda.decode(chunks, scale, esc_row, esc_col, esc_val, n, k)
    if kind == "triton":
        from w12_kernels.gemm import triton_path

        return triton_path.decode(chunks, scale, esc_row, esc_col, esc_val, n, k)
    from w12_kernels.gemm.layout import decode_packed

    return decode_packed(chunks, e0, esc_rowptr, esc_col, esc_val, n, k)


def linear(x, chunks, scale, e0, esc_rowptr, esc_row, esc_col, esc_val, esc_delta, bias, n, k):
    """``x @ W.T (+ bias)`` for a CUDA ``x`` [M, K] (see module docstring)."""
    m = x.shape[0]
    kind = backend()
    if m <= cfgs.SMALL_M_MAX and kind != "torch":
        cfg = small_config(n, k, x.device)
        if kind == "cuda":
            lay = cfg.layout(m)
            return cuda.gemm_small(x, chunks, scale, esc_rowptr, esc_col, esc_delta, bias, n, k,
                                   kw=cfg.kw, depth=lay.depth, prefetch=lay.prefetch,
                                   tiles=lay.tiles, min_blocks=lay.min_blocks,
                                   x_stages=lay.x_stages)
        from w12_kernels.gemm import triton_path

        return triton_path.gemm(x, chunks, scale, esc_rowptr, esc_row, esc_col, esc_delta, bias,
                                n, k, kw=cfg.kw)
    weight = decode(chunks, scale, e0, esc_rowptr, esc_row, esc_col, esc_val, n, k)
    return torch.nn.functional.linear(x, weight, bias)
