"""W12 GEMM: ``y = x @ W.T (+ bias)`` straight from the 12-bit planes.

Usage::

    from w12_kernels.gemm import prepare_weight, w12_linear

    pw = prepare_weight(w12_tensor, device="cuda")   # once, at load time
    y = w12_linear(x, pw, bias)                       # x: bfloat16 [..., K] -> [..., N]

``w12_linear`` is the ``torch.library`` op ``w12::linear`` (works under ``torch.compile`` and
CUDA-graph capture; warm it up once before capturing, so Triton compiles outside the graph).
On a GPU it runs Triton kernels: up to 64 rows of ``x`` a decode-GEMM straight from the planes
with one configuration for every such M (batch invariant); above that, as the tuned table in
``tuned.json`` says, a Triton decode to BF16 plus cuBLAS (or the same kernel with wider
activation tiles). Without a GPU it decodes with plain torch and calls
``torch.nn.functional.linear``. ``decode_weight`` gives the exact BF16 weight back;
``reference.reference_linear`` is the readable float64 reference. Calls on one weight must be
stream-ordered (the split-K arrival counters live in the packed weight).
"""

from w12_kernels.gemm.layout import DECODE_BIAS, PackedW12, decode_weight, prepare_weight
from w12_kernels.gemm.op import triton_available, w12_linear

__all__ = [
    "DECODE_BIAS",
    "PackedW12",
    "decode_weight",
    "prepare_weight",
    "triton_available",
    "w12_linear",
]
