"""W12 GEMM: ``y = x @ W.T (+ bias)`` straight from the 12-bit records.

Usage::

    from w12_kernels.gemm import prepare_weight, w12_linear

    pw = prepare_weight(w12_tensor, device="cuda")   # once, at load time
    y = w12_linear(x, pw, bias)                       # x: bfloat16 [..., K] -> [..., N]

``w12_linear`` is the ``torch.library`` op ``w12::linear`` (works under ``torch.compile`` and
CUDA-graph capture; call it once before capturing, so the kernels compile outside the graph).
On a GPU, up to 64 rows of ``x`` run a decode-GEMM straight from the packed chunks with one
configuration for every such M (batch invariant): CUDA C kernels compiled with NVRTC when CuPy
is installed, Triton kernels otherwise. With the CUDA kernels 65..128 rows run as two passes of
at most 64 (still batch invariant; on Hopper one pass with the same bits where the table says it
is faster), or, inside ``invariant_rows(64)`` (prefill) or with ``invariant_rows=64``, the
large-M path below, 1.4-1.7x as fast. Above that (above 64 rows with Triton) the tuned table
picks per shape and row count the fastest of: the warpgroup-MMA kernel (Hopper, CUDA backend,
``kernels_large.cu``), a Triton tensor-core kernel that decodes the weight tile by tile into
``tl.dot`` (``kernel_large.py``), or the weight decoded to BF16 and multiplied by cuBLAS.
Without a GPU it decodes with numba and calls ``torch.nn.functional.linear``.
``decode_weight`` gives the exact BF16 weight back; ``reference.reference_linear`` is the
readable float64 reference.
"""

from w12_kernels.gemm.config import SMALL_M_MAX
from w12_kernels.gemm.launcher import backend, invariant_rows
from w12_kernels.gemm.layout import DECODE_BIAS, PackedW12, decode_weight, prepare_weight
from w12_kernels.gemm.op import w12_linear

__all__ = [
    "DECODE_BIAS",
    "SMALL_M_MAX",
    "PackedW12",
    "backend",
    "decode_weight",
    "invariant_rows",
    "prepare_weight",
    "w12_linear",
]
