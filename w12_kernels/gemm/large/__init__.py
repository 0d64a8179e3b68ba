"""The large-M warpgroup-MMA kernel (``kernels.cu``, Hopper), its launcher and the stream-K
schedule (``stream_k.py``)."""
