"""The small-M mma.sync kernel (``kernels.cu``) and its launcher."""
