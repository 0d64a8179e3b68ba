"""W12 checkpoint folders: safetensors shards holding W12 planes and plain tensors.

A folder holds ``model.safetensors`` or, when the writer needed more than one shard,
``model-0000i-of-0000N.safetensors`` plus ``model.safetensors.index.json``: the Hugging Face
naming. A converted weight ``<module>.weight`` [N, K] is stored as the six tensors
``<module>.w12_hi``, ``.w12_lo``, ``.w12_e0``, ``.w12_esc_rowptr``, ``.w12_esc_col`` and
``.w12_esc_val``, so that a serving engine maps them onto parameters of ``<module>`` the way GPTQ's
``qweight``/``scales`` are; row pointers and column indices use the narrowest unsigned dtype for
their range, so the bytes written are exactly ``W12Tensor.nbytes``. Every other tensor keeps its
name and dtype. Each shard's header ``__metadata__`` names the format and version and lists its
tensors (original name, shape, dtype, CRC-32 of the stored bytes, CRC-32 of the decoded BF16
bytes); the index, or the only shard, carries the folder-level record. FORMAT.md is the spec.

The writer lays out the safetensors bytes itself instead of calling ``safetensors.torch``: the
library writes ``__metadata__`` in hash-map order, which changes from process to process, and
this format promises byte-identical files for identical input. It uses the library's tensor order
and padding, so the files are ordinary safetensors files. The reader trusts nothing it has not
checked: it parses every header itself (length capped by the file size, strict JSON, contiguous
offsets, shapes that match the records) and reads one tensor at a time with plain file reads, so
a corrupt, truncated or foreign file can only produce ``W12Error``.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from w12 import spec
from w12.errors import W12Error
from w12.tensor import W12Tensor

W12_SUFFIXES = ("w12_hi", "w12_lo", "w12_e0", "w12_esc_rowptr", "w12_esc_col", "w12_esc_val")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
QUANT_METHOD = "w12"
LOSSLESS_RELATIVE_TO = ("source", "bf16_cast")

# Keys of header ``__metadata__`` / index ``metadata`` that belong to the format, not the user.
KEY_FORMAT = "w12_format"
KEY_VERSION = "w12_format_version"
KEY_TENSORS = "w12_tensors"
_RESERVED_KEYS = ("format", "total_size")
_RESERVED_PREFIX = "w12_"

# safetensors dtype codes in the library's enum order; shards store higher ranks first, which
# keeps every tensor aligned to its item size.
_DTYPE_CODES = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32",
                "U32", "F32", "F64", "I64", "U64")
_TORCH_DTYPES = dict(zip(_DTYPE_CODES, (
    torch.bool, torch.uint8, torch.int8, torch.float8_e5m2, torch.float8_e4m3fn, torch.int16,
    torch.uint16, torch.float16, torch.bfloat16, torch.int32, torch.uint32, torch.float32,
    torch.float64, torch.int64, torch.uint64), strict=True))
_CODE_OF_TORCH = {dtype: code for code, dtype in _TORCH_DTYPES.items()}
_RANK = {code: rank for rank, code in enumerate(_DTYPE_CODES)}
_ITEMSIZE = {code: dtype.itemsize for code, dtype in _TORCH_DTYPES.items()}
_FIELDS = ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val")  # W12Tensor, in suffix order
_UINT_CODES = {8: "U8", 16: "U16", 32: "U32", 64: "U64"}
_NUMPY_OF_CODE = {"U8": np.uint8, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64,
                  "I16": np.int16}

_MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses larger headers too
_MAX_INDEX_BYTES = 64 << 20
_SHARD_NAME = re.compile(r"[A-Za-z0-9_.-]+\.safetensors")
_CRC = re.compile(r"[0-9a-f]{8}")


# ----------------------------------------------------------------------------- small helpers


def bf16_crc32(t: torch.Tensor) -> int:
    """CRC-32 of a BF16 tensor's bytes (row-major, little-endian): the ``bf16_crc32`` record."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
        raise W12Error(f"bf16_crc32 expects a bfloat16 tensor, got {getattr(t, 'dtype', t)!r}")
    return zlib.crc32(_tensor_bytes(t))


def component_names(weight_name: str) -> list[str]:
    """The six stored tensor names of the converted weight ``<module>.weight``."""
    module = _module_of(weight_name, "component_names")
    return [f"{module}.{suffix}" for suffix in W12_SUFFIXES]


def _module_of(weight_name: str, where: str) -> str:
    if not weight_name.endswith(".weight") or weight_name == ".weight":
        raise W12Error(f"{where}: a W12 tensor must be named <module>.weight, "
                       f"got {_show(weight_name)}")
    return weight_name[: -len(".weight")]


def _tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array on the CPU (little-endian, row-major)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def _show(value: object, limit: int = 120) -> str:
    """A name from a file, safe to put into a one-line message (quoted when it is odd)."""
    if not isinstance(value, str):
        text = _oneline(repr(value))
        return text if len(text) <= limit else text[:limit] + "..."
    if value.isprintable() and 0 < len(value) <= limit:
        return value
    return json.dumps(value[:limit]) + ("..." if len(value) > limit else "")


def _oneline(text: str) -> str:
    return " ".join(str(text).split())


def _hex(crc: int) -> str:
    return f"{crc:08x}"


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0  # bool is an int subclass; JSON true is no count


def _is_dtype_code(value: object) -> bool:
    return isinstance(value, str) and value in _TORCH_DTYPES


def _numel(shape: Sequence[int]) -> int:
    """Element count, saturating at 2**64 so that a lying header cannot make the product huge."""
    if 0 in shape:
        return 0
    total = 1
    for size in shape:
        total = min(total * size, 1 << 64)
    return total


# ----------------------------------------------------------------------------- shard layout


@dataclass(frozen=True)
class _Stored:
    """One tensor as it sits in a shard: name, dtype code, shape, and (when writing) its bytes."""

    name: str
    code: str
    shape: tuple[int, ...]
    data: np.ndarray | None = None
    begin: int = 0
    end: int = 0

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * _ITEMSIZE[self.code]


def _layout_order(entries: Sequence[_Stored]) -> list[_Stored]:
    return sorted(entries, key=lambda e: (-_RANK[e.code], e.name))


def _encode_header(entries: Sequence[_Stored], metadata: Mapping[str, str]) -> bytes:
    """The 8-byte length plus the space-padded JSON header that safetensors expects."""
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": e.code, "shape": list(e.shape),
                          "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the library pads it
    return struct.pack("<Q", len(raw)) + raw


def _write_shard(path: Path, entries: Sequence[_Stored], metadata: Mapping[str, str],
                 spool: Path) -> None:
    """Header first, then each entry's bytes copied from the spool file where ``add`` put them."""
    try:
        with open(path, "wb") as out, open(spool, "rb") as src:
            out.write(_encode_header(entries, metadata))
            for e in entries:
                _copy_range(src, out, e.begin, e.end - e.begin)
    except OSError as exc:
        raise W12Error(f"{path}: cannot write ({_oneline(exc.strerror or exc)})") from exc


def _copy_range(src, out, begin: int, length: int, chunk: int = 16 << 20) -> None:
    src.seek(begin)
    while length > 0:
        block = src.read(min(chunk, length))
        if not block:
            raise OSError(f"spool file ends {length} bytes early")
        out.write(block)
        length -= len(block)


# ----------------------------------------------------------------------------- writer


@dataclass
class _Unit:
    """What one ``add`` call stores: a plain tensor, or the six components of a W12 weight."""

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    entries: list[_Stored]
    num_escapes: int = 0
    bf16_crc32: int = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def record(self, crcs: Mapping[str, int]) -> dict[str, object]:
        record: dict[str, object] = {"name": self.name, "kind": self.kind, "dtype": self.dtype,
                                     "shape": list(self.shape)}
        if self.kind == "plain":
            record["crc32"] = _hex(crcs[self.entries[0].name])
            return record
        record["num_escapes"] = self.num_escapes
        record["bf16_crc32"] = _hex(self.bf16_crc32)
        parts = zip(W12_SUFFIXES, self.entries, strict=True)
        record["crc32"] = {suffix: _hex(crcs[e.name]) for suffix, e in parts}
        return record


def _plain_unit(name: str, t: torch.Tensor) -> _Unit:
    if not isinstance(t, torch.Tensor):
        raise W12Error(f"tensor {_show(name)}: expected a torch.Tensor or W12Tensor, "
                       f"got {type(t).__name__}")
    code = _CODE_OF_TORCH.get(t.dtype)
    if code is None:
        raise W12Error(f"tensor {_show(name)}: dtype {t.dtype} cannot be stored in safetensors")
    for suffix in W12_SUFFIXES:
        if name.endswith("." + suffix):
            raise W12Error(f"tensor {_show(name)}: plain tensor names must not end in .{suffix}")
    shape = tuple(int(s) for s in t.shape)
    entry = _Stored(name, code, shape, _tensor_bytes(t))
    return _Unit(name, "plain", shape, code, [entry])


def _w12_unit(name: str, w: W12Tensor, crc: int | None) -> _Unit:
    module = _module_of(name, f"tensor {_show(name)}")
    w = w.to("cpu")
    w.validate(name)
    n, k = w.shape
    e = w.num_escapes
    index_codes = {"w12_esc_rowptr": _UINT_CODES[spec.narrow_uint_bits(e)],
                   "w12_esc_col": _UINT_CODES[spec.narrow_uint_bits(max(k - 1, 0))]}
    entries = []
    for suffix, field in zip(W12_SUFFIXES, _FIELDS, strict=True):
        array = getattr(w, field).contiguous().numpy()
        code = index_codes.get(suffix, "I16" if suffix == "w12_esc_val" else "U8")
        data = np.ascontiguousarray(array.astype(_NUMPY_OF_CODE[code], copy=False))
        entries.append(_Stored(f"{module}.{suffix}", code, tuple(array.shape), data.view(np.uint8)))
    if crc is None:
        crc = bf16_crc32(w.decode())  # no source checksum given: vouch for the decode instead
    return _Unit(name, "w12", (n, k), "BF16", entries, num_escapes=e, bf16_crc32=crc)


class FolderWriter:
    """Streams tensors into safetensors shards of at most ``max_shard_bytes`` in ``folder``.

    ``add`` takes either a plain tensor (kept as is) or a ``W12Tensor`` under the original weight
    name (``<module>.weight``); ``close`` writes the last shard, the shard index and the
    per-tensor checksums/metadata. ``metadata`` (str -> str) is recorded in the folder.
    Each tensor's bytes go to a spool file on disk as soon as it is added, so memory holds one
    tensor at a time whatever the shard size; a shard is written (header first, then its
    tensors copied from the spool) when the next tensor would overflow it. A tensor larger than
    ``max_shard_bytes`` gets a shard of its own. Identical calls give byte-identical files.
    """

    def __init__(self, folder: Path, *, max_shard_bytes: int = 2 << 30,
                 metadata: dict[str, str] | None = None) -> None:
        self._folder = Path(folder)
        if type(max_shard_bytes) is not int or max_shard_bytes <= 0:
            raise W12Error(f"max_shard_bytes must be a positive integer, got {max_shard_bytes!r}")
        self._max_shard_bytes = max_shard_bytes
        self._metadata = _user_metadata(metadata or {})
        self._prepare_folder()
        self._pending: list[_Unit] = []
        self._pending_bytes = 0
        self._spool: Path | None = None
        self._crcs: dict[str, int] = {}
        self._partials: list[Path] = []
        self._shard_of: dict[str, int] = {}  # stored name -> shard number (1-based)
        self._taken: set[str] = set()
        self._total_bytes = 0
        self._closed = False

    def _prepare_folder(self) -> None:
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
            clash = [p.name for p in self._folder.iterdir() if _is_checkpoint_file(p.name)]
        except OSError as exc:
            raise W12Error(f"{self._folder}: cannot use as output ({_oneline(exc)})") from exc
        if clash:
            raise W12Error(f"{self._folder}: already holds a checkpoint ({sorted(clash)[0]})")

    def add(self, name: str, value: torch.Tensor | W12Tensor, *,
            bf16_crc32: int | None = None) -> None:
        """Queue one tensor; ``bf16_crc32`` is the source's checksum (``container.bf16_crc32``).

        Without it, a W12 weight's BF16 checksum is computed from its decode, which then vouches
        for the stored planes rather than for the original tensor. A CPU tensor is referenced, not
        copied, until its shard is written: do not modify it in place before then.
        """
        if self._closed:
            raise W12Error(f"{self._folder}: writer is closed, cannot add {_show(name)}")
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise W12Error(f"{self._folder}: invalid tensor name {_show(name)}")
        if isinstance(value, W12Tensor):
            unit = _w12_unit(name, value, bf16_crc32)
        else:
            unit = _plain_unit(name, value)
        self._claim(unit)
        if self._pending and self._pending_bytes + unit.nbytes > self._max_shard_bytes:
            self._flush()
        self._spool_unit(unit)
        self._pending.append(unit)
        self._pending_bytes += unit.nbytes

    def _claim(self, unit: _Unit) -> None:
        names = {unit.name} | {e.name for e in unit.entries}
        repeated = sorted(names & self._taken)
        if repeated:
            raise W12Error(f"{self._folder}: tensor {_show(repeated[0])} added twice")
        self._taken |= names

    def _spool_unit(self, unit: _Unit) -> None:
        """Append the unit's bytes to this shard's spool file; keep only offsets and CRCs."""
        if self._spool is None:
            self._spool = self._folder / f".model-{len(self._partials) + 1:05d}.spool"
        try:
            with open(self._spool, "ab") as f:
                offset = f.tell()
                for i, e in enumerate(unit.entries):
                    f.write(memoryview(e.data))
                    self._crcs[e.name] = zlib.crc32(e.data)
                    unit.entries[i] = replace(e, data=None, begin=offset, end=offset + e.nbytes)
                    offset += e.nbytes
        except OSError as exc:
            reason = _oneline(exc.strerror or exc)
            raise W12Error(f"{self._spool}: cannot write ({reason})") from exc

    def _flush(self) -> None:
        number = len(self._partials) + 1
        path = self._folder / f"model-{number:05d}.partial"
        entries = _layout_order([e for unit in self._pending for e in unit.entries])
        crcs = self._crcs
        records = [unit.record(crcs) for unit in self._pending]
        metadata = dict(self._metadata)
        metadata.update({"format": "pt", KEY_FORMAT: spec.FORMAT_NAME,
                         KEY_VERSION: str(spec.FORMAT_VERSION),
                         KEY_TENSORS: json.dumps(records, separators=(",", ":"),
                                                 ensure_ascii=False)})
        if self._spool is None:  # a folder with no tensor at all: an empty shard
            self._spool = self._folder / f".model-{number:05d}.spool"
            self._spool.touch()
        _write_shard(path, entries, metadata, self._spool)
        self._spool.unlink()
        self._spool = None
        self._partials.append(path)
        for e in entries:
            self._shard_of[e.name] = number
            self._total_bytes += e.nbytes
        self._pending, self._pending_bytes, self._crcs = [], 0, {}

    def close(self) -> None:
        """Write the last shard, give the shards their final names and write the index."""
        if self._closed:
            return
        self._closed = True
        if self._pending or not self._partials:
            self._flush()
        count = len(self._partials)
        names = [SINGLE_FILE] if count == 1 else [
            f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
        try:
            for partial, final in zip(self._partials, names, strict=True):
                os.replace(partial, self._folder / final)
            if count > 1:
                (self._folder / INDEX_FILE).write_text(self._index_json(names), encoding="utf-8")
        except OSError as exc:
            raise W12Error(f"{self._folder}: cannot finish ({_oneline(exc)})") from exc

    def _index_json(self, files: Sequence[str]) -> str:
        metadata: dict[str, object] = dict(self._metadata)
        metadata.update({"total_size": self._total_bytes, KEY_FORMAT: spec.FORMAT_NAME,
                         KEY_VERSION: str(spec.FORMAT_VERSION)})
        weight_map = {name: files[number - 1] for name, number in self._shard_of.items()}
        index = {"metadata": metadata, "weight_map": weight_map}
        return json.dumps(index, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def abandon(self) -> None:
        """Stop without finishing: remove the shards written so far."""
        self._closed = True
        for partial in self._partials:
            partial.unlink(missing_ok=True)
        if self._spool is not None:
            self._spool.unlink(missing_ok=True)
        self._pending = []

    def __enter__(self) -> FolderWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()


def _is_checkpoint_file(name: str) -> bool:
    return name in (SINGLE_FILE, INDEX_FILE) or bool(re.fullmatch(r"model-.*\.safetensors", name))


def _user_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise W12Error(f"metadata must map str to str, got {key!r}: {type(value).__name__}")
        if key in _RESERVED_KEYS or key.startswith(_RESERVED_PREFIX):
            raise W12Error(f"metadata key {key!r} is reserved by the W12 format")
    return dict(metadata)


# ----------------------------------------------------------------------------- reading: JSON


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {_show(key)}")
        result[key] = value
    return result


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not allowed")


def _parse_json(raw: bytes | str, where: str) -> object:
    """Strict JSON (no duplicate keys, no NaN) or a one-line ``W12Error`` naming ``where``."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(text, object_pairs_hook=_reject_duplicates,
                          parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise W12Error(f"{where} is not UTF-8 (byte {exc.start})") from exc
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise W12Error(f"{where} is not valid JSON ({_oneline(exc)})") from exc


def _check_format(meta: Mapping[str, object], where: str) -> None:
    name = meta.get(KEY_FORMAT)
    if name is None:
        raise W12Error(f"{where}: not a W12 checkpoint (no {KEY_FORMAT} in its metadata)")
    if name != spec.FORMAT_NAME:
        raise W12Error(f"{where}: format {_show(name)} is not {spec.FORMAT_NAME}")
    version = meta.get(KEY_VERSION)
    if not isinstance(version, str) or not re.fullmatch(r"[0-9]{1,9}", version):
        raise W12Error(f"{where}: format version {_show(version)} is not a version number")
    if int(version) != spec.FORMAT_VERSION:
        raise W12Error(f"{where}: format version {int(version)} is not supported "
                       f"(this reader knows {spec.FORMAT_VERSION})")


# ----------------------------------------------------------------------------- reading: shards


@dataclass(frozen=True)
class TensorInfo:
    """What the metadata says about one tensor, available without reading its data."""

    name: str
    kind: str  # "w12" or "plain"
    shape: tuple[int, ...]
    dtype: torch.dtype  # the dtype ``read`` (plain) or ``decode`` (W12) returns
    file: Path
    stored_nbytes: int
    num_escapes: int | None = None
    bf16_crc32: int | None = None


@dataclass(frozen=True)
class _Shard:
    path: Path
    data_start: int
    entries: dict[str, _Stored]
    metadata: dict[str, str]
    records: list[dict]


def _read_shard(path: Path) -> _Shard:
    raw, data_start, data_size = _read_header_bytes(path)
    header = _parse_json(raw, f"{path}: header")
    if not isinstance(header, dict):
        raise W12Error(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise W12Error(f"{path}: not a W12 checkpoint (no str -> str __metadata__ in its header)")
    _check_format(meta, str(path))
    entries = _parse_entries(header, path, data_size)
    if KEY_TENSORS not in meta:
        raise W12Error(f"{path}: header metadata has no {KEY_TENSORS} list")
    records = _parse_json(meta[KEY_TENSORS], f"{path}: metadata {KEY_TENSORS}")
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise W12Error(f"{path}: metadata {KEY_TENSORS} is not a list of tensor records")
    user = {k: v for k, v in meta.items() if k not in _RESERVED_KEYS
            and not k.startswith(_RESERVED_PREFIX)}
    return _Shard(path, data_start, entries, user, records)


def _read_header_bytes(path: Path) -> tuple[bytes, int, int]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise W12Error(f"{path}: {size} bytes is too short for a safetensors file")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(size - 8, _MAX_HEADER_BYTES):
                raise W12Error(f"{path}: header length {length} does not fit the file "
                               f"({size} bytes)")
            raw = f.read(length)
    except OSError as exc:
        raise W12Error(f"{path}: cannot read ({_oneline(exc.strerror or exc)})") from exc
    if len(raw) != length:
        raise W12Error(f"{path}: file shrank while reading its header")
    return raw, 8 + length, size - 8 - length


def _parse_entries(header: dict, path: Path, data_size: int) -> dict[str, _Stored]:
    entries = {name: _parse_entry(name, info, path) for name, info in header.items()}
    position = 0
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if e.begin != position:
            raise W12Error(f"{path}: tensor {_show(e.name)}: data starts at {e.begin}, "
                           f"expected {position} (gap or overlap)")
        position = e.end
    if position != data_size:
        raise W12Error(f"{path}: tensors cover {position} data bytes, the file holds {data_size}")
    return entries


def _parse_entry(name: str, info: object, path: Path) -> _Stored:
    where = f"{path}: tensor {_show(name)}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise W12Error(f"{where}: header entry needs exactly dtype, shape and data_offsets")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not _is_dtype_code(code):
        raise W12Error(f"{where}: unsupported dtype {_show(code)}")
    if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
        raise W12Error(f"{where}: shape {_show(shape)} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))
            and offsets[0] <= offsets[1]):
        raise W12Error(f"{where}: data_offsets {_show(offsets)} is not [begin, end]")
    entry = _Stored(name, code, tuple(shape), begin=offsets[0], end=offsets[1])
    if entry.end - entry.begin != entry.nbytes:
        raise W12Error(f"{where}: {entry.end - entry.begin} data bytes for shape {_show(shape)} "
                       f"of {code} ({entry.nbytes} bytes)")
    return entry


# ----------------------------------------------------------------------------- reading: records


@dataclass(frozen=True)
class _Parsed:
    info: TensorInfo
    parts: dict[str, tuple[_Stored, int]]  # suffix ("" for plain) -> stored tensor, crc32


_PLAIN_KEYS = {"name", "kind", "dtype", "shape", "crc32"}
_W12_KEYS = {"name", "kind", "dtype", "shape", "num_escapes", "bf16_crc32", "crc32"}


def _parse_record(record: dict, shard: _Shard) -> _Parsed:
    name = record.get("name")
    if not isinstance(name, str) or not name:
        raise W12Error(f"{shard.path}: tensor record without a name: {_show(record)}")
    where = f"{shard.path}: tensor {_show(name)}"
    kind = record.get("kind")
    keys = _PLAIN_KEYS if kind == "plain" else _W12_KEYS if kind == "w12" else None
    if keys is None:
        raise W12Error(f"{where}: record kind {_show(kind)} is neither plain nor w12")
    if set(record) != keys:
        raise W12Error(f"{where}: record needs exactly the keys {sorted(keys)}")
    shape = record["shape"]
    if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
        raise W12Error(f"{where}: record shape {_show(shape)} is not a list of sizes")
    if kind == "plain":
        return _plain_record(record, tuple(shape), shard, where)
    return _w12_record(record, tuple(shape), shard, where)


def _crc_field(value: object, where: str) -> int:
    if not isinstance(value, str) or not _CRC.fullmatch(value):
        raise W12Error(f"{where}: checksum {_show(value)} is not 8 lowercase hex digits")
    return int(value, 16)


def _stored(shard: _Shard, name: str, code: str, shape: tuple[int, ...], where: str) -> _Stored:
    entry = shard.entries.get(name)
    if entry is None:
        raise W12Error(f"{where}: stored tensor {_show(name)} is missing from the file")
    if entry.code != code or entry.shape != shape:
        raise W12Error(f"{where}: stored tensor {_show(name)} is {entry.code} "
                       f"{_show(list(entry.shape))}, the metadata says {code} {_show(list(shape))}")
    return entry


def _plain_record(record: dict, shape: tuple[int, ...], shard: _Shard, where: str) -> _Parsed:
    name, code = record["name"], record["dtype"]
    if not _is_dtype_code(code):
        raise W12Error(f"{where}: record dtype {_show(code)} is not a safetensors dtype")
    for suffix in W12_SUFFIXES:
        if name.endswith("." + suffix):
            raise W12Error(f"{where}: plain tensor names must not end in .{suffix}")
    entry = _stored(shard, name, code, shape, where)
    crc = _crc_field(record["crc32"], where)
    info = TensorInfo(name, "plain", shape, _TORCH_DTYPES[code], shard.path, entry.nbytes)
    return _Parsed(info, {"": (entry, crc)})


def _w12_record(record: dict, shape: tuple[int, ...], shard: _Shard, where: str) -> _Parsed:
    name = record["name"]
    module = _module_of(name, where)
    if record["dtype"] != "BF16":
        raise W12Error(f"{where}: W12 record dtype {_show(record['dtype'])} is not BF16")
    if len(shape) != 2:
        raise W12Error(f"{where}: W12 record shape {_show(list(shape))} is not 2-D")
    n, k = shape
    e = record["num_escapes"]
    if not _is_count(e) or e > n * k:
        raise W12Error(f"{where}: num_escapes {_show(e)} is not a count in [0, {n * k}]")
    crcs = record["crc32"]
    if not isinstance(crcs, dict) or set(crcs) != set(W12_SUFFIXES):
        raise W12Error(f"{where}: crc32 must map each of {list(W12_SUFFIXES)} to a checksum")
    if n * k > sum(x.nbytes for x in shard.entries.values()):
        raise W12Error(f"{where}: shape {list(shape)} is larger than the file's data")
    expected = _w12_layout(n, k, e)
    parts = {}
    for suffix in W12_SUFFIXES:
        code, part_shape = expected[suffix]
        entry = _stored(shard, f"{module}.{suffix}", code, part_shape, where)
        parts[suffix] = (entry, _crc_field(crcs[suffix], where))
    nbytes = sum(entry.nbytes for entry, _ in parts.values())
    info = TensorInfo(name, "w12", shape, torch.bfloat16, shard.path, nbytes, e,
                      _crc_field(record["bf16_crc32"], where))
    return _Parsed(info, parts)


def _w12_layout(n: int, k: int, e: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Stored dtype code and shape of each component of an [N, K] weight with E escapes."""
    return {
        "w12_hi": ("U8", (n, k)),
        "w12_lo": ("U8", (n, spec.lo_width(k))),
        "w12_e0": ("U8", (n,)),
        "w12_esc_rowptr": (_UINT_CODES[spec.narrow_uint_bits(e)], (n + 1,)),
        "w12_esc_col": (_UINT_CODES[spec.narrow_uint_bits(max(k - 1, 0))], (e,)),
        "w12_esc_val": ("I16", (e,)),
    }


# ----------------------------------------------------------------------------- reading: folder


def _index_files(folder: Path) -> tuple[list[Path], dict | None, dict | None]:
    """The shard paths, plus the index's metadata and weight map when there is an index."""
    index, single = folder / INDEX_FILE, folder / SINGLE_FILE
    try:
        if not folder.is_dir():
            raise W12Error(f"{folder}: not a folder")
        has_index, has_single = index.exists(), single.exists()
    except OSError as exc:
        raise W12Error(f"{folder}: cannot read ({_oneline(exc.strerror or exc)})") from exc
    if has_index and has_single:
        raise W12Error(f"{folder}: holds both {SINGLE_FILE} and {INDEX_FILE}; which is meant?")
    if has_single:
        return [single], None, None
    if not has_index:
        raise W12Error(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}")
    metadata, weight_map = _read_index(index)
    files = sorted(set(weight_map.values()))
    for file in files:
        if not (folder / file).is_file():
            holder = next(t for t, f in weight_map.items() if f == file)
            raise W12Error(f"{index}: shard {file} (holding tensor {_show(holder)}) is missing")
    return [folder / f for f in files], metadata, weight_map


def _read_index(path: Path) -> tuple[dict, dict]:
    try:
        if path.stat().st_size > _MAX_INDEX_BYTES:
            raise W12Error(f"{path}: larger than {_MAX_INDEX_BYTES} bytes, not a W12 index")
        raw = path.read_bytes()
    except OSError as exc:
        raise W12Error(f"{path}: cannot read ({_oneline(exc.strerror or exc)})") from exc
    index = _parse_json(raw, str(path))
    if not isinstance(index, dict) or set(index) != {"metadata", "weight_map"}:
        raise W12Error(f"{path}: needs exactly the keys metadata and weight_map")
    metadata, weight_map = index["metadata"], index["weight_map"]
    if not isinstance(metadata, dict):
        raise W12Error(f"{path}: metadata is not an object")
    _check_format(metadata, str(path))
    if not _is_count(metadata.get("total_size")):
        raise W12Error(f"{path}: metadata total_size {_show(metadata.get('total_size'))} "
                       f"is not a byte count")
    for key, value in metadata.items():
        if key != "total_size" and not isinstance(value, str):
            raise W12Error(f"{path}: metadata {_show(key)} is not a string")
    if not isinstance(weight_map, dict) or not weight_map:
        raise W12Error(f"{path}: weight_map is not a non-empty object")
    for name, file in weight_map.items():
        if not isinstance(file, str) or not _SHARD_NAME.fullmatch(file):
            raise W12Error(f"{path}: tensor {_show(name)} maps to {_show(file)}, "
                           f"not a .safetensors file name in this folder")
    return metadata, weight_map


def _check_against_index(shards: Sequence[_Shard], index: Path, metadata: dict,
                         weight_map: dict) -> None:
    total = 0
    user = {k: v for k, v in metadata.items() if k not in _RESERVED_KEYS
            and not k.startswith(_RESERVED_PREFIX)}
    listed_in: dict[str, set[str]] = {}
    for name, file in weight_map.items():
        listed_in.setdefault(file, set()).add(name)
    for shard in shards:
        listed = listed_in.get(shard.path.name, set())
        unmatched = sorted(set(shard.entries) ^ listed)
        if unmatched:
            name = unmatched[0]
            where = "is not listed in" if name in shard.entries else "is not in the file, says"
            raise W12Error(f"{shard.path}: tensor {_show(name)} {where} {INDEX_FILE}")
        if shard.metadata != user:
            raise W12Error(f"{shard.path}: header metadata differs from {INDEX_FILE} "
                           f"(a shard of another checkpoint?)")
        total += sum(e.nbytes for e in shard.entries.values())
    if total != metadata["total_size"]:
        raise W12Error(f"{index}: total_size {metadata['total_size']} but the shards hold "
                       f"{total} bytes")


class FolderReader:
    """Reads a W12 folder lazily, one tensor at a time, checking version and checksums.

    Any problem (missing shard, foreign file, wrong version, checksum or shape mismatch) raises
    ``W12Error`` with one line naming the file and the tensor. Opening reads only the headers;
    ``read`` reads one tensor's bytes, checks their CRC-32 and returns canonical dtypes.
    """

    def __init__(self, folder: Path) -> None:
        self._folder = Path(folder)
        files, index_meta, weight_map = _index_files(self._folder)
        shards = [_read_shard(path) for path in files]
        if index_meta is not None:
            _check_against_index(shards, self._folder / INDEX_FILE, index_meta, weight_map)
        self._metadata = dict(shards[0].metadata)
        self._data_starts = {shard.path: shard.data_start for shard in shards}
        self._tensors: dict[str, _Parsed] = {}
        for shard in shards:
            self._add_shard(shard)

    def _add_shard(self, shard: _Shard) -> None:
        claimed: set[str] = set()
        for record in shard.records:
            parsed = _parse_record(record, shard)
            name = parsed.info.name
            if name in self._tensors:
                raise W12Error(f"{shard.path}: tensor {_show(name)} appears twice in the folder")
            stored = {entry.name for entry, _ in parsed.parts.values()}
            if stored & claimed:
                raise W12Error(f"{shard.path}: tensor {_show(name)} shares stored tensors "
                               f"with another record")
            claimed |= stored
            self._tensors[name] = parsed
        orphans = sorted(set(shard.entries) - claimed)
        if orphans:
            raise W12Error(f"{shard.path}: stored tensor {_show(orphans[0])} has no record")

    @property
    def folder(self) -> Path:
        return self._folder

    def names(self) -> list[str]:
        """Original tensor names (``<module>.weight`` for converted weights), in file order."""
        return list(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def info(self, name: str) -> TensorInfo:
        """Shape, dtype, file and checksums of one tensor, without reading it."""
        return self._lookup(name).info

    def is_w12(self, name: str) -> bool:
        return self._lookup(name).info.kind == "w12"

    def read(self, name: str) -> torch.Tensor | W12Tensor:
        parsed = self._lookup(name)
        info = parsed.info
        where = f"{info.file}: tensor {_show(name)}"
        if info.kind == "plain":
            entry, crc = parsed.parts[""]
            data = torch.from_numpy(self._load(info.file, entry, crc, where))
            if not data.numel():  # torch gives an empty array stride 0, which view() refuses
                return torch.empty(info.shape, dtype=info.dtype)
            return data.view(info.dtype).reshape(info.shape)
        arrays = {suffix: self._load(info.file, entry, crc, where).view(_NUMPY_OF_CODE[entry.code])
                  for suffix, (entry, crc) in parsed.parts.items()}
        return _assemble(arrays, info, where)

    def items(self) -> Iterator[tuple[str, torch.Tensor | W12Tensor]]:
        for name in self._tensors:
            yield name, self.read(name)

    def check_decode(self, name: str) -> None:
        """Decode a W12 tensor and compare it with its recorded ``bf16_crc32``."""
        info = self.info(name)
        if info.kind != "w12":
            raise W12Error(f"{info.file}: tensor {_show(name)} is not a W12 tensor")
        crc = bf16_crc32(self.read(name).decode())
        if crc != info.bf16_crc32:
            raise W12Error(f"{info.file}: tensor {_show(name)}: decoded BF16 checksum {_hex(crc)} "
                           f"differs from the recorded {_hex(info.bf16_crc32)}")

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self._metadata)

    def _lookup(self, name: str) -> _Parsed:
        parsed = self._tensors.get(name)
        if parsed is None:
            raise W12Error(f"{self._folder}: no tensor named {_show(name)}")
        return parsed

    def _load(self, path: Path, entry: _Stored, crc: int, where: str) -> np.ndarray:
        """The stored bytes of one tensor (uint8), after checking their CRC-32."""
        buffer = np.empty(entry.end - entry.begin, np.uint8)
        try:
            with open(path, "rb") as f:
                f.seek(self._data_starts[path] + entry.begin)
                got = f.readinto(memoryview(buffer))
        except OSError as exc:
            raise W12Error(f"{where}: cannot read ({_oneline(exc.strerror or exc)})") from exc
        if got != buffer.size:
            raise W12Error(f"{where}: file ends inside stored tensor {_show(entry.name)}")
        actual = zlib.crc32(buffer)
        if actual != crc:
            raise W12Error(f"{where}: checksum mismatch in stored tensor {_show(entry.name)} "
                           f"(crc32 {_hex(actual)}, recorded {_hex(crc)})")
        return buffer


def _assemble(data: dict[str, np.ndarray], info: TensorInfo, where: str) -> W12Tensor:
    """Canonical-dtype ``W12Tensor`` from the stored arrays, checked before it is returned."""
    n, k = info.shape
    rowptr, col = data["w12_esc_rowptr"], data["w12_esc_col"]
    # range checks happen in the stored unsigned dtypes, before the narrowing casts could wrap
    if rowptr.size and int(rowptr.max()) > info.num_escapes:
        raise W12Error(f"{where}: escape row pointer {int(rowptr.max())} exceeds the "
                       f"{info.num_escapes} escapes")
    if col.size and int(col.max()) >= k:
        raise W12Error(f"{where}: escape column {int(col.max())} outside [0, {k})")
    w = W12Tensor(
        hi=torch.from_numpy(data["w12_hi"].reshape(n, k)),
        lo=torch.from_numpy(data["w12_lo"].reshape(n, spec.lo_width(k))),
        e0=torch.from_numpy(data["w12_e0"]),
        esc_rowptr=torch.from_numpy(rowptr.astype(np.int64)),
        esc_col=torch.from_numpy(col.astype(np.int32)),
        esc_val=torch.from_numpy(data["w12_esc_val"].copy()),
    )
    w.validate(where)
    return w


# ----------------------------------------------------------------------------- config.json


@dataclass(frozen=True)
class QuantizationConfig:
    """The ``quantization_config`` entry of a W12 checkpoint's ``config.json``, checked."""

    converted_modules: tuple[str, ...]
    lm_head_converted: bool
    embeddings_converted: bool
    lossless_relative_to: str
    format_version: int = spec.FORMAT_VERSION


def quantization_config(*, converted_modules: Sequence[str], lm_head_converted: bool,
                        embeddings_converted: bool, lossless_relative_to: str) -> dict:
    """The dict written under ``quantization_config`` in ``config.json`` (FORMAT.md).

    ``converted_modules`` are module names (``<module>`` of ``<module>.weight``), stored sorted
    so that the file does not depend on conversion order.
    """
    if isinstance(converted_modules, str | bytes):
        raise W12Error(f"quantization_config: converted_modules must be a list of module names, "
                       f"got the string {_show(converted_modules)}")
    config = {
        "quant_method": QUANT_METHOD,
        "format_version": spec.FORMAT_VERSION,
        "converted_modules": sorted(set(converted_modules)),
        "lm_head_converted": lm_head_converted,
        "embeddings_converted": embeddings_converted,
        "lossless_relative_to": lossless_relative_to,
    }
    parse_quantization_config(config, where="quantization_config")
    return config


def parse_quantization_config(config: object, *,
                              where: str = "quantization_config") -> QuantizationConfig:
    """Check a ``quantization_config`` dict; unknown keys are ignored (FORMAT.md, versioning)."""
    if not isinstance(config, dict):
        raise W12Error(f"{where}: expected an object, got {type(config).__name__}")
    if config.get("quant_method") != QUANT_METHOD:
        raise W12Error(f"{where}: quant_method {_show(config.get('quant_method'))} is not "
                       f"{QUANT_METHOD}")
    version = config.get("format_version")
    if version != spec.FORMAT_VERSION or type(version) is not int:
        raise W12Error(f"{where}: format version {_show(version)} is not supported "
                       f"(this reader knows {spec.FORMAT_VERSION})")
    modules = config.get("converted_modules")
    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        raise W12Error(f"{where}: converted_modules must be a list of module names")
    for key in ("lm_head_converted", "embeddings_converted"):
        if not isinstance(config.get(key), bool):
            raise W12Error(f"{where}: {key} must be true or false, got {_show(config.get(key))}")
    relative = config.get("lossless_relative_to")
    if relative not in LOSSLESS_RELATIVE_TO:
        raise W12Error(f"{where}: lossless_relative_to {_show(relative)} is not one of "
                       f"{list(LOSSLESS_RELATIVE_TO)}")
    return QuantizationConfig(tuple(modules), config["lm_head_converted"],
                              config["embeddings_converted"], relative, version)
