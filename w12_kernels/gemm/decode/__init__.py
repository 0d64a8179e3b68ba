"""Decoding the packed weight to BF16: the CUDA kernels (``kernels.cu``, ``launcher.py``) for
the large-M rows no GEMM kernel takes, and the numba decode (``cpu.py``) of the CPU path."""
