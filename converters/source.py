"""Reading a Hugging Face safetensors checkpoint folder, one tensor at a time.

A folder holds either ``model.safetensors`` or shards listed in ``model.safetensors.index.json``.
All headers are read up front (cheap, no tensor data), so that a missing shard, a foreign file, a
tensor listed in the index but absent from its shard, or a refused dtype is reported before any
output is written. Data is then read one tensor at a time with ``safe_open``; each read opens the
shard anew so that the memory map (whose touched pages count towards the process's resident
memory) never covers more than the tensor being read.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from w12.errors import W12Error
from w12.jsonio import read_json, read_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Files that hold weights in some format; everything else in a checkpoint folder is copied.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
WEIGHT_INDEX_SUFFIX = ".index.json"
SKIPPED_DIRS = (".git", ".cache", ".huggingface")

_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class TensorEntry:
    """Where one source tensor lives and what it is, known from the headers alone."""

    name: str
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class HFCheckpoint:
    """The weights of a Hugging Face checkpoint folder, indexed from headers, read lazily."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise W12Error(f"{self.folder}: not a folder")
        listed = _index_weight_map(self.folder)
        self.shards = _shard_files(self.folder, listed)
        self.entries: dict[str, TensorEntry] = {}
        for shard in self.shards:
            for entry in _read_header(shard):
                if entry.name in self.entries:
                    other = self.entries[entry.name].file.name
                    raise W12Error(f"{shard}: tensor {entry.name} is also stored in {other}")
                self.entries[entry.name] = entry
        if listed is not None:
            _check_index_matches(self.folder, listed, self.entries)

    def names(self) -> list[str]:
        return list(self.entries)

    @property
    def largest_tensor_bytes(self) -> int:
        return max((e.nbytes for e in self.entries.values()), default=0)

    def read(self, name: str) -> torch.Tensor:
        """One tensor, exactly as stored (dtype and shape from the header)."""
        entry = self.entries[name]
        try:
            with safe_open(str(entry.file), framework="pt") as handle:
                tensor = handle.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types; report them as ours
            raise W12Error(f"{entry.file}: tensor {name}: cannot read ({_one_line(exc)})") from exc
        if tensor.dtype != entry.dtype or tuple(tensor.shape) != entry.shape:
            raise W12Error(
                f"{entry.file}: tensor {name}: read {tensor.dtype} {tuple(tensor.shape)}, "
                f"header says {entry.dtype} {entry.shape}"
            )
        return tensor

    def config(self) -> dict | None:
        """``config.json`` as a dict, or None when the folder has none."""
        return read_json_object(self.folder / "config.json", required=False)

    def other_files(self) -> list[Path]:
        """Files that are not weights (config, tokenizer, templates...), relative to the folder."""
        return other_files(self.folder)


def other_files(folder: Path) -> list[Path]:
    """Every file under ``folder`` that is not a weight file or weight index, sorted."""
    found = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part in SKIPPED_DIRS for part in relative.parts) or not path.is_file():
            continue
        name = path.name
        if name.endswith(WEIGHT_SUFFIXES) or name.endswith(WEIGHT_INDEX_SUFFIX):
            continue
        found.append(relative)
    return found


def _shard_files(folder: Path, weight_map: dict[str, str] | None) -> list[Path]:
    if weight_map is not None:
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not (folder / shard).is_file():
                held = sorted(name for name, file in weight_map.items() if file == shard)
                raise W12Error(f"{folder / shard}: shard listed in {INDEX_FILE} is missing "
                               f"(it holds tensor {held[0]} and {len(held) - 1} more)")
        return [folder / shard for shard in shards]
    single = folder / SINGLE_FILE
    if single.is_file():
        return [single]
    raise W12Error(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors checkpoints)")


def _index_weight_map(folder: Path) -> dict[str, str] | None:
    path = folder / INDEX_FILE
    if not path.is_file():
        return None
    index = read_json(path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and "/" not in v and v not in ("", ".", "..")
        for k, v in weight_map.items()
    ):
        raise W12Error(f"{path}: 'weight_map' must map tensor names to shard file names")
    return weight_map


def _read_header(shard: Path) -> list[TensorEntry]:
    try:
        with safe_open(str(shard), framework="pt") as handle:
            # offset order reads the file front to back; older safetensors only sort by name
            names = list(getattr(handle, "offset_keys", handle.keys)())
            slices = [(name, handle.get_slice(name)) for name in names]
            specs = [(name, s.get_dtype(), tuple(s.get_shape())) for name, s in slices]
    except Exception as exc:  # a foreign or corrupt file: report it as ours, in one line
        culprit = _diagnose_header(shard)
        detail = f"tensor {culprit}" if culprit else _one_line(exc)
        raise W12Error(f"{shard}: not a readable safetensors file ({detail})") from exc
    entries = []
    for name, dtype_name, shape in specs:
        if dtype_name not in _DTYPES:
            raise W12Error(f"{shard}: tensor {name}: unsupported dtype {dtype_name}")
        entries.append(TensorEntry(name, shard, _DTYPES[dtype_name], shape))
    return entries


def _diagnose_header(shard: Path) -> str | None:
    """Name the tensor whose header entry disagrees with its bytes, when that is the problem."""
    try:
        with open(shard, "rb") as f:
            length = struct.unpack("<Q", f.read(8))[0]
            data_bytes = shard.stat().st_size - 8 - length
            if length > 100_000_000 or data_bytes < 0:
                return None
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            size = _DTYPES[info["dtype"]].itemsize
            needed = size * math.prod(info["shape"])
            if end - begin != needed:
                return (f"{name}: shape {info['shape']} of {info['dtype']} needs {needed} bytes, "
                        f"its offsets hold {end - begin}")
            if end > data_bytes:
                return f"{name}: data ends at byte {end} but the file holds {data_bytes}"
    except Exception:  # a header too broken to point at one tensor; the caller says why
        return None
    return None


def _check_index_matches(folder: Path, listed: dict[str, str], found: dict[str, TensorEntry]):
    for name, shard in listed.items():
        entry = found.get(name)
        if entry is None:
            raise W12Error(f"{folder / shard}: tensor {name} listed in {INDEX_FILE} is missing")
        if entry.file.name != shard:
            raise W12Error(
                f"{entry.file}: tensor {name} is stored here but {INDEX_FILE} says {shard}"
            )
    for name, entry in found.items():
        if name not in listed:
            raise W12Error(f"{entry.file}: tensor {name} is not listed in {INDEX_FILE}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
