"""GPU kernels that read W12 planes directly, one folder per op (``gemm/``, ...).

Each op folder holds its Triton kernel(s), a launcher (shape checks, allocation, grid), a plain
torch fallback used when no GPU is present, and a readable ``reference.py``. Triton is imported
only when a kernel is launched, so the package imports without it.
"""
