"""The small-M warpgroup-MMA kernel (``kernels.cu``, Hopper) and its launcher."""
