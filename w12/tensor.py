"""``W12Tensor``: one encoded 2-D BF16 weight, with its planes as torch tensors on any device.

The public entry points are :func:`encode` and :meth:`W12Tensor.decode`. Both dispatch on the
device: CPU tensors go through the numba codec (``w12.codec_cpu``), other devices through the
vectorised torch codec (``w12.codec_torch``). The two produce identical planes, which the tests
check, so a tensor encoded on a GPU and saved decodes the same on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from w12 import spec
from w12.errors import W12Error


@dataclass(frozen=True)
class W12Tensor:
    """The W12 v1 planes of a weight ``W[N, K]`` (rows are output channels).

    ``hi``: uint8 [N, K]; ``lo``: uint8 [N, ceil(K/2)]; ``e0``: uint8 [N];
    ``esc_rowptr``: int64 [N+1]; ``esc_col``: int32 [E]; ``esc_val``: int16 [E] (BF16 bits).
    """

    hi: torch.Tensor
    lo: torch.Tensor
    e0: torch.Tensor
    esc_rowptr: torch.Tensor
    esc_col: torch.Tensor
    esc_val: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.hi.shape[0]), int(self.hi.shape[1]))

    @property
    def device(self) -> torch.device:
        return self.hi.device

    @property
    def num_escapes(self) -> int:
        return int(self.esc_col.numel())

    @property
    def nbytes(self) -> int:
        """Bytes of storage on disk, everything counted (see ``spec.storage_nbytes``)."""
        n, k = self.shape
        return spec.storage_nbytes(n, k, self.num_escapes)

    @property
    def bits_per_weight(self) -> float:
        n, k = self.shape
        return 8.0 * self.nbytes / max(n * k, 1)

    def to(self, device: torch.device | str) -> W12Tensor:
        return W12Tensor(*(getattr(self, f).to(device) for f in _FIELDS))

    def decode(self) -> torch.Tensor:
        """The exact BF16 tensor this was encoded from, on the same device."""
        if self.device.type == "cpu":
            from w12 import codec_cpu

            return codec_cpu.decode(self)
        from w12 import codec_torch

        return codec_torch.decode(self)

    def validate(self, name: str = "tensor") -> None:
        """Check shapes, dtypes, index ranges and the canonical-encoding rules of FORMAT.md
        (escapes sorted by column, their records 0, their values truly outside the window, the
        unused nibble of odd K zero); raise ``W12Error`` naming ``name``."""
        _validate(self, name)
        _validate_canonical(self, name)


_FIELDS = ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val")
PLANE_DTYPES = {  # the dtype of every plane, in storage order
    "hi": torch.uint8,
    "lo": torch.uint8,
    "e0": torch.uint8,
    "esc_rowptr": torch.int64,
    "esc_col": torch.int32,
    "esc_val": torch.int16,
}


def encode(t: torch.Tensor) -> W12Tensor:
    """Encode a 2-D BF16 tensor (any device) into W12 planes on the same device."""
    if not isinstance(t, torch.Tensor):
        raise W12Error(f"encode expects a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.bfloat16:
        raise W12Error(f"encode expects a bfloat16 tensor, got {t.dtype}")
    if t.dim() != 2:
        raise W12Error(f"encode expects a 2-D tensor, got shape {tuple(t.shape)}")
    t = t.contiguous()
    if t.device.type == "cpu":
        from w12 import codec_cpu

        return codec_cpu.encode(t)
    from w12 import codec_torch

    return codec_torch.encode(t)


def _validate(w: W12Tensor, name: str) -> None:
    for field in _FIELDS:
        value = getattr(w, field)
        expected = PLANE_DTYPES[field]
        if value.dtype != expected:
            raise W12Error(f"{name}: {field} has dtype {value.dtype}, expected {expected}")
    if w.hi.dim() != 2:
        raise W12Error(f"{name}: hi plane must be 2-D, got shape {tuple(w.hi.shape)}")
    n, k = w.shape
    expected = {
        "lo": (n, spec.lo_width(k)),
        "e0": (n,),
        "esc_rowptr": (n + 1,),
        "esc_val": tuple(w.esc_col.shape),
    }
    for field, shape in expected.items():
        if tuple(getattr(w, field).shape) != shape:
            raise W12Error(
                f"{name}: {field} has shape {tuple(getattr(w, field).shape)}, expected {shape}"
            )
    if w.esc_col.dim() != 1:
        raise W12Error(f"{name}: esc_col must be 1-D, got shape {tuple(w.esc_col.shape)}")
    rowptr = w.esc_rowptr
    if int(rowptr[0]) != 0 or int(rowptr[-1]) != w.num_escapes:
        raise W12Error(
            f"{name}: escape row pointers must run from 0 to {w.num_escapes}, "
            f"got {int(rowptr[0])}..{int(rowptr[-1])}"
        )
    if n and bool((rowptr[1:] < rowptr[:-1]).any()):
        raise W12Error(f"{name}: escape row pointers decrease")
    if w.num_escapes and (int(w.esc_col.min()) < 0 or int(w.esc_col.max()) >= k):
        raise W12Error(f"{name}: escape column index outside [0, {k})")
    if n and (int(w.e0.min()) < spec.E0_MIN or int(w.e0.max()) > spec.E0_MAX):
        raise W12Error(f"{name}: base exponent outside [{spec.E0_MIN}, {spec.E0_MAX}]")


def _validate_canonical(w: W12Tensor, name: str) -> None:
    n, k = w.shape
    if k % 2 and n and bool((w.lo[:, -1] >> 4).any()):
        raise W12Error(f"{name}: unused high nibble of the last lo byte is not 0 (odd K={k})")
    if not w.num_escapes:
        return
    counts = w.esc_rowptr[1:] - w.esc_rowptr[:-1]
    rows = torch.repeat_interleave(torch.arange(n, device=w.device), counts)
    col = w.esc_col.long()
    if bool(((rows[1:] == rows[:-1]) & (col[1:] <= col[:-1])).any()):
        raise W12Error(f"{name}: escape columns do not increase within a row")
    nibbles = (w.lo[rows, col >> 1].long() >> ((col & 1) * 4)) & 15
    if bool(w.hi[rows, col].any()) or bool(nibbles.any()):
        raise W12Error(f"{name}: an escape's record (hi byte, lo nibble) is not 0")
    exponent = (w.esc_val.long() >> 7) & 0xFF
    offset = exponent - w.e0[rows].long()
    counted = (exponent >= 1) & (exponent <= 254)
    if bool((counted & (offset >= 0) & (offset < spec.WINDOW_BINADES)).any()):
        raise W12Error(f"{name}: an escape holds a value inside its row's window")
