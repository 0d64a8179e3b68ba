"""Bit-exact comparison of a W12 folder with the checkpoint it was converted from.

Every source tensor must be in the W12 folder, and nothing else may be; each one is decoded (W12)
or read (plain) and compared bit for bit with the source, one tensor at a time. When the folder
records that it is lossless relative to the BF16 cast of the source, wide float source tensors
are cast the same way before comparing. Differences are collected, not raised: the caller decides
how to report them (the CLI exits with code 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from converters.source import HFCheckpoint
from w12 import container
from w12.jsonio import read_json_object

_WIDE_FLOATS = (torch.float32, torch.float16, torch.float64)


@dataclass
class VerifyReport:
    checked: int = 0
    identical: int = 0
    w12_tensors: int = 0
    compared_bytes: int = 0
    lossless_relative_to: str = "source"
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_folder(*, src: Path, dst: Path, progress: bool = True) -> VerifyReport:
    """Compare every tensor of the W12 folder ``dst`` with the HF checkpoint ``src``."""
    checkpoint = HFCheckpoint(Path(src))
    reader = container.FolderReader(Path(dst))
    report = VerifyReport(lossless_relative_to=_lossless_relative_to(Path(dst)))
    stored = reader.names()
    stored_set = set(stored)
    source_names = checkpoint.names()
    for name in source_names:
        if name not in stored_set:
            report.problems.append(f"{name}: missing from {dst}")
    extra = sorted(stored_set - set(source_names))
    report.problems.extend(f"{name}: in {dst} but not in the source" for name in extra)
    present = [name for name in source_names if name in stored_set]
    cast = report.lossless_relative_to == "bf16_cast"
    for name in tqdm(present, desc="verify", unit="tensor", disable=not progress):
        _verify_tensor(name, checkpoint, reader, report, cast=cast)
    return report


def _verify_tensor(name: str, checkpoint: HFCheckpoint, reader, report: VerifyReport, *,
                   cast: bool) -> None:
    expected = checkpoint.read(name)
    if cast and expected.dtype in _WIDE_FLOATS:
        expected = expected.to(torch.bfloat16)
    value = reader.read(name)
    if reader.is_w12(name):
        report.w12_tensors += 1
        value = value.decode()
    report.checked += 1
    report.compared_bytes += expected.numel() * expected.element_size()
    problem = first_difference(expected, value)
    if problem is None:
        report.identical += 1
    else:
        report.problems.append(f"{name}: {problem}")


def first_difference(expected: torch.Tensor, actual: torch.Tensor) -> str | None:
    """None when the two tensors are bit-identical, else where and how they first differ."""
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    if tuple(expected.shape) != tuple(actual.shape):
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    size = expected.element_size()
    a = expected.contiguous().reshape(-1).view(torch.uint8)
    b = actual.contiguous().reshape(-1).view(torch.uint8)
    if torch.equal(a, b):  # the common case, at memory speed
        return None
    a, b = a.reshape(-1, size), b.reshape(-1, size)
    differs = (a != b).any(dim=1)
    flat = int(differs.nonzero()[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape))
    count = int(differs.sum())
    return (f"{count} element(s) differ, first at index {index}: "
            f"0x{_hex(a[flat])} in the source, 0x{_hex(b[flat])} in the W12 folder")


def _hex(row: torch.Tensor) -> str:
    return bytes(reversed(row.tolist())).hex()  # little-endian bytes, printed as one number


def _lossless_relative_to(folder: Path) -> str:
    """What the folder's config says it is lossless against ("source" when it does not say)."""
    path = folder / "config.json"
    config = read_json_object(path, required=False)
    if config is None or "quantization_config" not in config:
        return "source"
    parsed = container.parse_quantization_config(config["quantization_config"],
                                                 where=f"{path}: quantization_config")
    return parsed.lossless_relative_to
