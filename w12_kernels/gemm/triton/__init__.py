"""The Triton kernels (``kernels.py``) and their launcher: the portable small-M path and the
decode to BF16 where the CUDA kernels cannot run."""
