"""Kernel launches on the GPU that holds their tensors.

Triton launches a kernel on the process's current CUDA device and stream, whatever device its
tensors live on; a tensor on ``cuda:1`` while ``cuda:0`` is current would be read through the
wrong device. ``on_device_of(t)`` makes ``t``'s GPU current around a launch (and its current
stream the launch's stream), and costs nothing where it already is current or ``t`` is on the
CPU (the interpreter). The CUDA C launchers switch CuPy's device the same way
(``gemm/cuda/runtime.py``).
"""

from __future__ import annotations

import contextlib
import functools

import torch


def on_device_of(t: torch.Tensor):
    """A context in which ``t``'s GPU is the current device (a no-op where it already is)."""
    device = t.device
    if device.type != "cuda" or device.index is None \
            or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)




def launches_on_its_tensors(fn):
    """Decorate a launcher whose first argument is a tensor: its kernels run on that tensor's
    GPU (``on_device_of``)."""

    @functools.wraps(fn)
    def launch(first, *args, **kwargs):
        with on_device_of(first):
            return fn(first, *args, **kwargs)

    return launch


__all__ = ["launches_on_its_tensors", "on_device_of"]
