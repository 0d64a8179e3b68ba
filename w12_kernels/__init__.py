"""GPU kernels that read W12 planes directly, one folder per op (``gemm/``, ...).

An op folder holds its public entry points, its dispatch, a readable ``reference.py``, and one
sub-folder per kernel family with the family's kernels and launcher (shape checks, compile,
grid, launch); ``gemm/cuda/`` holds the CUDA code the families share. docs/KERNELS.md
describes the layout. CuPy and Triton are imported only when a kernel is launched, so the
package imports without them.
"""
