"""Fuzzing the folder reader: a mutated W12 folder must give ``W12Error`` and nothing else.

A small valid folder (two shards plus an index; W12 weights with every kind of escape, an odd K, a
16-bit column index, plain tensors of several dtypes) is written once. Each case applies one
seeded mutation to one file of a scratch copy -- byte flips, truncation, insertion, deletion,
header-length edits, structural edits of a header's JSON, of its ``w12_tensors`` records or of the
index, JSON garbage, data edits with the checksum repaired so that the checks behind the checksum
run, missing or swapped files -- then opens the folder, reads every tensor and decodes the W12
ones. Every case has its own random generator seeded from (seed, case number), so one failing case
can be replayed alone.

Run as a script for longer campaigns or to replay a case:
``python tests/w12/test_fuzz_reader.py --cases 200000 --seed 7`` or ``... --only 1234``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numba
import numpy as np
import torch

import w12
from w12 import container
from w12.errors import W12Error

CASES = 10_000
SEED = 20240611

_NASTY_VALUES = [0, 1, -1, 2, 3, 7, 255, 256, 65535, 65536, 2**31, 2**32, 2**63, 2**64, 10**30,
                 1.5, -0.0, "", "x", "1", "7", "BF16", "U8", "U16", "I16", "w12", "pt", "plain",
                 None, True, False, [], {}, [0], [1, 2], [0, 0], [-1, 5], [2**40, 2**40], {"a": 1}]
_JSON_GARBAGE = [
    b"", b" ", b"[]", b"null", b"123", b'"w12"', b"{", b"}", b"{}", b'{"__metadata__":5}',
    b'{"__metadata__":{"w12_format":"w12"}}', b'{"__metadata__":{"a":1}}',
    b'{"__metadata__":{"w12_format":"w12","w12_format_version":"1"}}',
    b'{"__metadata__":{"w12_format":"w12","w12_format_version":"1","w12_tensors":"[{}]"}}',
    b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{}}', b'{"x":NaN}',
    b'{"x":Infinity}', b"[" * 20000, b'{"a":' * 5000, b"1" * 5000, b"\xff\xfe\xfd",
    b'{"\xc3\x28":1}', b'{"\\ud800":1}', b'{"a\\u0000":1}',
]


def make_source() -> dict[str, torch.Tensor]:
    """The tensors of the fuzzed folder, from fixed bits (no RNG state of torch involved)."""
    gen = np.random.default_rng(1234)
    a = gen.standard_normal((3, 7)).astype(np.float32)
    a_bits = (a.view(np.uint32) >> 16).astype(np.uint16)
    a_bits[0, [1, 4]] = [0x0000, 0x8000]  # +-0
    a_bits[1, [0, 2, 6]] = [0x0001, 0x7F80, 0xFFC3]  # subnormal, +inf, NaN with payload
    a_bits[2, 3] = 0x1234  # a normal far outside the row's window
    b = (gen.standard_normal((2, 300)) * 0.02).astype(np.float32)
    b_bits = (b.view(np.uint32) >> 16).astype(np.uint16)
    b_bits[1, 299] = 0x0000

    def bf16(bits: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)

    return {
        "model.layers.0.mlp.up_proj.weight": bf16(a_bits),
        "model.norm.weight": bf16(np.arange(7, dtype=np.uint16) + 0x3F80),
        "lm_head.weight": bf16(b_bits),
        "step": torch.tensor(12345, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
    }


def write_folder(folder: Path, source: dict[str, torch.Tensor]) -> None:
    with container.FolderWriter(folder, max_shard_bytes=700, metadata={"origin": "fuzz"}) as out:
        for name, tensor in source.items():
            is_weight = name.endswith(".weight") and tensor.dim() == 2
            out.add(name, w12.encode(tensor) if is_weight else tensor)


def read_everything(folder: Path) -> dict[str, torch.Tensor]:
    """Open, read every tensor, decode the W12 ones (this is what must only raise W12Error)."""
    reader = container.FolderReader(folder)
    out = {}
    for name, value in reader.items():
        if isinstance(value, w12.W12Tensor):
            reader.check_decode(name)
            value = value.decode()
        out[name] = value
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


# ----------------------------------------------------------------------------- mutations


def _split(data: bytes) -> tuple[dict, bytes] | None:
    """A shard's header as JSON plus its data area, or None when it does not parse."""
    try:
        (length,) = struct.unpack("<Q", data[:8])
        return json.loads(data[8 : 8 + length]), data[8 + length :]
    except (struct.error, ValueError):
        return None


def _join(header: object, body: bytes, rng: random.Random) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    if rng.random() < 0.7:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, prefix + (i,))
    return found


def _new_value(old: object, rng: random.Random) -> object:
    if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.5:
        return old + rng.choice([-2, -1, 1, 2, 8, old, -old - 1, 1 << 32])
    if isinstance(old, str) and rng.random() < 0.3:
        if len(old) == 8 and rng.random() < 0.5:
            return f"{rng.getrandbits(32):08x}"  # a well-formed, wrong checksum
        return old[: rng.randrange(len(old) + 1)] + rng.choice(["", "0", "z", "\n", "\u2028"])
    return rng.choice(_NASTY_VALUES)


def mutate_json(doc: object, rng: random.Random) -> object:
    """Replace, delete, add or rename one node somewhere in a JSON tree."""
    path = rng.choice(_paths(doc))
    if not path:
        return _new_value(doc, rng)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    action = rng.random()
    if action < 0.6:
        parent[key] = _new_value(parent[key], rng)
    elif action < 0.75:
        del parent[key]
    elif action < 0.9 and isinstance(parent, dict):
        parent[key + rng.choice(["", "x", ".weight", ".w12_hi"])] = _new_value(None, rng)
    elif isinstance(parent, dict):
        parent[rng.choice(list(parent))] = parent.pop(key)  # move a value under another key
    else:
        parent.append(_new_value(None, rng))
    return doc


def _mutate_header(data: bytes, rng: random.Random) -> bytes:
    parts = _split(data)
    if parts is None:
        return data[::-1]
    header, body = parts
    return _join(mutate_json(header, rng), body, rng)


def _mutate_records(data: bytes, rng: random.Random) -> bytes:
    parts = _split(data)
    if parts is None:
        return data[:-1]
    header, body = parts
    meta = header["__metadata__"]
    meta["w12_tensors"] = json.dumps(mutate_json(json.loads(meta["w12_tensors"]), rng))
    return _join(header, body, rng)


def _mutate_data_keep_crc(data: bytes, rng: random.Random) -> bytes:
    """Change stored bytes and repair the recorded checksum, so the checks behind it run."""
    header, body = _split(data)
    name = rng.choice([n for n, e in header.items() if n != "__metadata__" and e["shape"] != [0]])
    begin, end = header[name]["data_offsets"]
    chunk = bytearray(body[begin:end])
    for _ in range(rng.randint(1, 3)):
        chunk[rng.randrange(len(chunk))] ^= rng.choice([1, 0x80, rng.randrange(1, 256)])
    body = body[:begin] + bytes(chunk) + body[end:]
    meta = header["__metadata__"]
    records = json.loads(meta["w12_tensors"])
    crc = f"{zlib.crc32(chunk):08x}"
    for record in records:
        if record["name"] == name:
            record["crc32"] = crc
        elif record["kind"] == "w12":
            module = record["name"].removesuffix(".weight")
            for suffix in container.W12_SUFFIXES:
                if name == f"{module}.{suffix}":
                    record["crc32"][suffix] = crc
    meta["w12_tensors"] = json.dumps(records)
    return _join(header, body, rng)


def _flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        limit = len(out) if rng.random() < 0.5 else min(len(out), 200)
        out[rng.randrange(limit)] ^= rng.randrange(1, 256)
    return bytes(out)


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.choice([0, 1, 7, 8, 9, rng.randrange(len(data)), len(data) - 1])]


def _insert(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.randbytes(rng.randint(1, 16)) + data[at:]


def _delete(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data))
    return data[:at] + data[at + rng.randint(1, 16) :]


def _header_length(data: bytes, rng: random.Random) -> bytes:
    (length,) = struct.unpack("<Q", data[:8])
    new = rng.choice([0, 1, 2, length - 1, length + 1, length + 8, len(data) - 8, len(data),
                      2**31, 2**63, 2**64 - 1, rng.randrange(2**64)])
    return struct.pack("<Q", new % 2**64) + data[8:]


def _garbage_header(data: bytes, rng: random.Random) -> bytes:
    raw = rng.choice(_JSON_GARBAGE)
    return struct.pack("<Q", len(raw)) + raw + data[8 + struct.unpack("<Q", data[:8])[0] :]


def _mutate_index(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.2:
        return rng.choice(_JSON_GARBAGE)
    index = json.loads(data)
    return json.dumps(mutate_json(index, rng), indent=rng.choice([None, 2])).encode()


_SHARD_MUTATIONS = {
    "flip": _flip, "truncate": _truncate, "insert": _insert, "delete": _delete,
    "header_length": _header_length, "header_json": _mutate_header,
    "records_json": _mutate_records, "data_keep_crc": _mutate_data_keep_crc,
    "garbage_header": _garbage_header,
}
_INDEX_MUTATIONS = {"index_json": _mutate_index, "index_flip": _flip,
                    "index_truncate": _truncate, "index_insert": _insert}


def mutate_folder(files: dict[str, bytes], rng: random.Random) -> tuple[str, dict]:
    """One mutation: its kind and the new contents of the files it touches (None = delete)."""
    shards = sorted(n for n in files if n.endswith(".safetensors"))
    index = container.INDEX_FILE
    roll = rng.random()
    if roll < 0.04:
        return "missing_file", {rng.choice(sorted(files)): None}
    if roll < 0.06:
        return "swap_shards", {shards[0]: files[shards[1]], shards[1]: files[shards[0]]}
    if roll < 0.08:
        return "random_file", {rng.choice(sorted(files)): rng.randbytes(rng.randrange(64, 2048))}
    if roll < 0.25:
        kind = rng.choice(sorted(_INDEX_MUTATIONS))
        return kind, {index: _INDEX_MUTATIONS[kind](files[index], rng)}
    kind = rng.choice(sorted(_SHARD_MUTATIONS))
    shard = rng.choice(shards)
    return kind, {shard: _SHARD_MUTATIONS[kind](files[shard], rng)}


# ----------------------------------------------------------------------------- campaign


def _try_read(folder: Path, label: str) -> bool:
    """True when the folder read cleanly, False on W12Error; anything else is a failure."""
    try:
        read_everything(folder)
    except W12Error as exc:
        message = str(exc)
        if not message or "\n" in message or "\r" in message:
            raise AssertionError(f"{label}: W12Error message is not one line: {message!r}") from exc
        return False
    except Exception as exc:
        raise AssertionError(f"{label}: {type(exc).__name__} escaped: {exc}") from exc
    return True


def _restore(scratch: Path, pristine: Path, name: str) -> None:
    """Put the pristine file back as a hard link (cheap; copies where links are unsupported)."""
    (scratch / name).unlink(missing_ok=True)
    try:
        os.link(pristine / name, scratch / name)
    except OSError:
        shutil.copyfile(pristine / name, scratch / name)


def run_campaign(cases: int, seed: int, *, only: int | None = None) -> collections.Counter:
    """Mutate and read ``cases`` folders; the counter holds kinds and outcomes."""
    source = make_source()
    counts: collections.Counter = collections.Counter()
    threads = numba.get_num_threads()
    # the tensors are tiny: a parallel decode's thread start-up costs more than the work
    numba.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pristine, scratch = Path(tmp) / "pristine", Path(tmp) / "scratch"
            write_folder(pristine, source)
            scratch.mkdir()
            files = {p.name: p.read_bytes() for p in sorted(pristine.iterdir())}
            for name in files:
                _restore(scratch, pristine, name)
            check_pristine(scratch, source)
            for case in range(cases) if only is None else [only]:
                rng = random.Random(f"{seed}:{case}")
                kind, changes = mutate_folder(files, rng)
                for name, content in changes.items():
                    # unlink first: a new file is much cheaper than truncating one in place
                    (scratch / name).unlink()
                    if content is not None:
                        (scratch / name).write_bytes(content)
                clean = _try_read(scratch, f"seed {seed} case {case} ({kind})")
                counts[kind] += 1
                counts["read cleanly" if clean else "W12Error"] += 1
                for name in changes:
                    _restore(scratch, pristine, name)
            check_pristine(scratch, source)
    finally:
        numba.set_num_threads(threads)
    return counts


def check_pristine(folder: Path, source: dict[str, torch.Tensor]) -> None:
    got = read_everything(folder)
    assert list(got) == list(source)
    for name, tensor in source.items():
        assert same_bits(got[name], tensor), name


def test_fuzz_reader_only_raises_w12error():
    counts = run_campaign(CASES, SEED)
    assert counts["W12Error"] + counts["read cleanly"] == CASES
    assert sum(v for k, v in counts.items() if k not in ("W12Error", "read cleanly")) == CASES
    # both outcomes occur: most mutations are caught, and edits such as a repaired checksum
    # over a changed mantissa nibble legitimately read
    assert counts["W12Error"] > 0 and counts["read cleanly"] > 0
    assert len(counts) == len(_SHARD_MUTATIONS) + len(_INDEX_MUTATIONS) + 3 + 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=CASES)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--only", type=int, default=None, help="replay one case number")
    args = parser.parse_args()
    counts = run_campaign(args.cases, args.seed, only=args.only)
    for key, value in sorted(counts.items()):
        print(f"{key:>16}: {value}")


if __name__ == "__main__":
    sys.exit(main())
