"""W12 GEMM: ``y = x @ W.T (+ bias)`` straight from the 12-bit records.

Usage::

    from w12_kernels.gemm import prepare_weight, w12_linear

    pw = prepare_weight(w12_tensor, device="cuda")   # once, at load time
    y = w12_linear(x, pw, bias)                       # x: bfloat16 [..., K] -> [..., N]

``w12_linear`` is the ``torch.library`` op ``w12::linear`` (works under ``torch.compile`` and
CUDA-graph capture; call it once before capturing, so the kernels compile outside the graph).
On a GPU, up to ``SMALL_M_MAX`` (64) rows of ``x`` run a decode-GEMM straight from the packed
chunks with one K split for every such M (batch invariant): CUDA C kernels compiled with NVRTC
when CuPy is installed (``small/``, ``wgmma/``), Triton kernels otherwise (``triton/``). With
the CUDA kernels 65..128 rows run as two passes of at most 64 (still batch invariant), or,
inside ``invariant_rows(64)`` (prefill) or with ``invariant_rows=64``, the large-M path.
Above that the tuned table (``table.py``) picks per shape and row count the warpgroup-MMA
kernel (Hopper, ``large/``) or the weight decoded to BF16 and multiplied by cuBLAS
(``decode/``). Without a GPU it decodes with numba and calls ``torch.nn.functional.linear``.
``decode_weight`` gives the exact BF16 weight back; ``reference.reference_linear`` is the
readable float64 reference. docs/KERNELS.md describes the kernels and the table.
"""

from w12_kernels.gemm.dispatch import backend, invariant_rows
from w12_kernels.gemm.layout import DECODE_BIAS, PackedW12, decode_weight, prepare_weight
from w12_kernels.gemm.op import w12_linear
from w12_kernels.gemm.rows import linear_rows, linear_tiles, rows_reproducible, tile_escapes
from w12_kernels.gemm.table import SMALL_M_MAX

__all__ = [
    "DECODE_BIAS",
    "SMALL_M_MAX",
    "PackedW12",
    "backend",
    "decode_weight",
    "invariant_rows",
    "linear_rows",
    "linear_tiles",
    "prepare_weight",
    "rows_reproducible",
    "tile_escapes",
    "w12_linear",
]
