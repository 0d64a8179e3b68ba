"""Statistics of a W12 folder: storage per tensor, escape rates, and exponent histograms.

Sizes and escape counts come from the container's metadata (``FolderReader.info``); the
histograms need the planes, so each W12 tensor is read once (its checksums are checked on the
way). ``e0`` is counted per row; exponent offsets ``eoff`` (bits 6..3 of the hi byte) per
in-window element, which is every element minus the escapes, whose records are all zero.
Bits per weight count every stored byte: planes, ``e0``, and escape lists with their indices.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from w12 import spec
from w12.container import FolderReader


@dataclass(frozen=True)
class TensorStats:
    name: str
    kind: str  # "w12" or the dtype of a plain tensor
    shape: tuple[int, ...]
    elements: int
    stored_bytes: int
    escapes: int

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.stored_bytes / max(self.elements, 1)


@dataclass
class FolderStats:
    folder: Path
    tensors: list[TensorStats] = field(default_factory=list)
    file_bytes: int = 0
    e0_histogram: list[int] = field(default_factory=lambda: [0] * 256)
    eoff_histogram: list[int] = field(default_factory=lambda: [0] * spec.WINDOW_BINADES)

    def _total(self, attr: str, w12_only: bool) -> int:
        return sum(getattr(t, attr) for t in self.tensors if t.kind == "w12" or not w12_only)

    @property
    def bits_per_weight(self) -> float:
        """All tensors, all stored tensor bytes (safetensors headers excluded)."""
        return 8.0 * self._total("stored_bytes", False) / max(self._total("elements", False), 1)

    @property
    def w12_bits_per_weight(self) -> float:
        return 8.0 * self._total("stored_bytes", True) / max(self._total("elements", True), 1)

    @property
    def escape_rate(self) -> float:
        return self._total("escapes", True) / max(self._total("elements", True), 1)

    def to_json(self) -> dict:
        return {
            "folder": str(self.folder),
            "tensors": [{**asdict(t), "shape": list(t.shape),
                         "bits_per_weight": t.bits_per_weight} for t in self.tensors],
            "stored_bytes": self._total("stored_bytes", False),
            "elements": self._total("elements", False),
            "file_bytes": self.file_bytes,
            "bits_per_weight": self.bits_per_weight,
            "w12_tensors": sum(1 for t in self.tensors if t.kind == "w12"),
            "w12_bits_per_weight": self.w12_bits_per_weight,
            "w12_elements": self._total("elements", True),
            "escapes": self._total("escapes", True),
            "escape_rate": self.escape_rate,
            "e0_histogram": {str(e): c for e, c in enumerate(self.e0_histogram) if c},
            "eoff_histogram": list(self.eoff_histogram),
        }


def inspect_folder(*, folder: Path) -> FolderStats:
    """Read every tensor record of the W12 folder and every W12 plane once."""
    folder = Path(folder)
    reader = FolderReader(folder)
    stats = FolderStats(folder=folder,
                        file_bytes=sum(p.stat().st_size for p in folder.glob("*.safetensors")))
    for name in reader.names():
        info = reader.info(name)
        elements = 1
        for size in info.shape:
            elements *= size
        is_w12 = info.kind == "w12"
        kind = "w12" if is_w12 else str(info.dtype).removeprefix("torch.")
        stats.tensors.append(TensorStats(name, kind, tuple(info.shape), elements,
                                         info.stored_nbytes, info.num_escapes or 0))
        if is_w12:
            _count_exponents(reader.read(name), stats)
    return stats


def _count_exponents(w, stats: FolderStats) -> None:
    e0 = torch.bincount(w.e0.to(torch.int64), minlength=256)
    eoff = torch.bincount(((w.hi >> 3) & 15).reshape(-1).to(torch.int64),
                          minlength=spec.WINDOW_BINADES)
    eoff[0] -= w.num_escapes  # an escape's record is 0, which reads as eoff 0
    for i, count in enumerate(e0.tolist()):
        stats.e0_histogram[i] += count
    for i, count in enumerate(eoff.tolist()):
        stats.eoff_histogram[i] += count


def histogram_bars(counts: dict[int, int] | list[int], *, width: int = 40,
                   label: str = "") -> list[str]:
    """Text bars for the non-empty range of a histogram (one line per bin)."""
    items = dict(enumerate(counts)) if isinstance(counts, list) else dict(counts)
    used = [k for k, v in items.items() if v]
    if not used:
        return [f"{label}(empty)"]
    peak = max(items.values())
    lines = []
    for key in range(min(used), max(used) + 1):
        count = items.get(key, 0)
        bar = "#" * (round(width * count / peak) if count else 0)
        lines.append(f"{label}{key:>4} {count:>12,} {bar}")
    return lines
