"""The CUDA C side shared by the kernel families: headers (``common.cuh``, ``wgmma.cuh``) and
the host runtime (``runtime.py``: NVRTC compilation, launch)."""
