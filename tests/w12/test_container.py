"""Tests of W12 checkpoint folders: round trips, sharding, narrow dtypes, golden bytes, bad input.

Files are inspected with a small safetensors parser written here (and with the safetensors
library itself), not with the reader under test. Bad-input tests check that the error is a
one-line ``W12Error`` naming the file and, where there is one, the tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_save
from safetensors.torch import save_file as safetensors_save_file

import w12
from w12 import container, spec
from w12.errors import W12Error

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val")


# ----------------------------------------------------------------------------- helpers


def bf16(bits) -> torch.Tensor:
    array = np.asarray(bits, dtype=np.uint16)
    return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)


def weights(n: int, k: int, seed: int, escapes: int = 3) -> torch.Tensor:
    """Gaussian BF16 weights with a few zeros, infs, NaNs and far-away values sprinkled in."""
    gen = np.random.default_rng(seed)
    bits = (gen.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if n * k:
        special = np.array([0x0000, 0x8000, 0x0001, 0x7F80, 0xFFC1, 0x0F00], np.uint16)
        flat = bits.reshape(-1)
        flat[gen.integers(0, n * k, escapes)] = gen.choice(special, escapes)
    return bf16(bits)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def assert_same_w12(a: w12.W12Tensor, b: w12.W12Tensor) -> None:
    for field in FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and torch.equal(x, y), field


def parse_file(path: Path) -> tuple[dict, bytes, int]:
    """(header JSON, data area, header length) of a safetensors file, parsed independently."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :], length


def records_of(path: Path) -> list[dict]:
    return json.loads(parse_file(path)[0]["__metadata__"]["w12_tensors"])


def write_header(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def edit_records(path: Path, edit) -> None:
    header, data, _ = parse_file(path)
    records = json.loads(header["__metadata__"]["w12_tensors"])
    edit(records)
    header["__metadata__"]["w12_tensors"] = json.dumps(records)
    write_header(path, header, data)


def edit_data(path: Path, stored_name: str, edit) -> None:
    """Change one stored tensor's bytes and repair its checksum, so deeper checks are reached."""
    header, data, _ = parse_file(path)
    begin, end = header[stored_name]["data_offsets"]
    chunk = bytearray(data[begin:end])
    edit(chunk)
    data = data[:begin] + bytes(chunk) + data[end:]
    records = json.loads(header["__metadata__"]["w12_tensors"])
    module, suffix = stored_name.rsplit(".", 1)
    for record in records:
        if record["name"] == f"{module}.weight":
            record["crc32"][suffix] = f"{zlib.crc32(chunk):08x}"
    header["__metadata__"]["w12_tensors"] = json.dumps(records)
    write_header(path, header, data)


def raises_w12(*fragments: str):
    """Context: expect a one-line W12Error whose message contains every fragment."""
    return _Raises(fragments)


class _Raises:
    def __init__(self, fragments):
        self.fragments = fragments

    def __enter__(self):
        self.ctx = pytest.raises(W12Error)
        self.info = self.ctx.__enter__()
        return self.info

    def __exit__(self, *exc):
        handled = self.ctx.__exit__(*exc)
        message = str(self.info.value)
        assert "\n" not in message, message
        for fragment in self.fragments:
            assert str(fragment) in message, (fragment, message)
        return handled


def write(folder: Path, tensors: dict, **kwargs) -> Path:
    with container.FolderWriter(folder, **kwargs) as writer:
        for name, value in tensors.items():
            writer.add(name, value)
    return folder


def read_all(folder: Path) -> dict:
    return dict(container.FolderReader(folder).items())


@pytest.fixture
def mixed():
    """A realistic little checkpoint: W12 weights (one with odd K) and plain tensors."""
    return {
        "model.embed_tokens.weight": weights(11, 16, seed=1).float(),  # plain FP32
        "model.layers.0.self_attn.q_proj.weight": w12.encode(weights(16, 16, seed=2)),
        "model.layers.0.mlp.down_proj.weight": w12.encode(weights(16, 33, seed=3, escapes=9)),
        "model.layers.0.input_layernorm.weight": weights(1, 16, seed=4)[0],
        "model.norm.weight": torch.ones(16, dtype=torch.bfloat16),
        "lm_head.weight": w12.encode(weights(11, 16, seed=5)),
        "step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
    }


def check_round_trip(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        if isinstance(value, w12.W12Tensor):
            assert isinstance(got[name], w12.W12Tensor)
            assert_same_w12(got[name], value)
            assert same_bits(got[name].decode(), value.decode())
        else:
            assert same_bits(got[name], value), name


# ----------------------------------------------------------------------------- round trips


def test_round_trip_single_file(tmp_path, mixed):
    folder = write(tmp_path / "ckpt", mixed, metadata={"converter": "test", "note": "é ü"})
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]
    reader = container.FolderReader(folder)
    assert reader.metadata == {"converter": "test", "note": "é ü"}
    assert reader.names() == list(mixed)
    kinds = [isinstance(v, w12.W12Tensor) for v in mixed.values()]
    assert [reader.is_w12(n) for n in mixed] == kinds
    check_round_trip(dict(reader.items()), mixed)


def test_read_returns_canonical_dtypes(tmp_path, mixed):
    folder = write(tmp_path / "ckpt", mixed)
    w = container.FolderReader(folder).read("model.layers.0.mlp.down_proj.weight")
    assert [getattr(w, f).dtype for f in FIELDS] == [
        torch.uint8, torch.uint8, torch.uint8, torch.int64, torch.int32, torch.int16]


@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (1, 2), (3, 7), (0, 5), (4, 0), (5, 255)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_round_trip_awkward_shapes(tmp_path, shape):
    source = weights(*shape, seed=sum(shape), escapes=min(3, shape[0] * shape[1]))
    folder = write(tmp_path / "ckpt", {"x.weight": w12.encode(source)})
    got = container.FolderReader(folder).read("x.weight")
    assert same_bits(got.decode(), source)


def test_plain_dtypes_round_trip(tmp_path):
    tensors = {name: torch.arange(6).reshape(2, 3).to(dtype) for name, dtype in [
        ("f64", torch.float64), ("f16", torch.float16), ("i8", torch.int8), ("i16", torch.int16),
        ("i32", torch.int32), ("u8", torch.uint8), ("f8", torch.float8_e4m3fn),
        ("f8b", torch.float8_e5m2)]}
    tensors["u16"] = torch.from_numpy(np.array([1, 65535], np.uint16))
    tensors["u64"] = torch.from_numpy(np.array([2**64 - 1], np.uint64))
    tensors["empty"] = torch.zeros(0, 4, dtype=torch.bfloat16)
    tensors["noncontiguous"] = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    folder = write(tmp_path / "ckpt", tensors)
    got = read_all(folder)
    for name, value in tensors.items():
        assert same_bits(got[name], value.contiguous()), name


def test_empty_writer_gives_an_empty_readable_folder(tmp_path):
    folder = write(tmp_path / "ckpt", {}, metadata={"a": "b"})
    reader = container.FolderReader(folder)
    assert reader.names() == [] and reader.metadata == {"a": "b"}


def test_safetensors_library_reads_our_files(tmp_path, mixed):
    folder = write(tmp_path / "ckpt", mixed, metadata={"converter": "test"})
    down = mixed["model.layers.0.mlp.down_proj.weight"]
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        assert f.metadata()["w12_format"] == "w12" and f.metadata()["converter"] == "test"
        assert same_bits(f.get_tensor("model.norm.weight"), mixed["model.norm.weight"])
        assert torch.equal(f.get_tensor("model.layers.0.mlp.down_proj.w12_hi"), down.hi)
        col = f.get_tensor("model.layers.0.mlp.down_proj.w12_esc_col")
        assert col.dtype == torch.uint8 and torch.equal(col.to(torch.int32), down.esc_col)


# ----------------------------------------------------------------------------- sharding


def test_several_shards(tmp_path, mixed):
    max_bytes = 1000
    folder = write(tmp_path / "ckpt", mixed, max_shard_bytes=max_bytes, metadata={"k": "v"})
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    count = len(shards)
    assert count >= 3
    assert shards == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    index = json.loads((folder / container.INDEX_FILE).read_text())
    assert set(index) == {"metadata", "weight_map"}
    stored_total = 0
    for shard in shards:
        header, data, _ = parse_file(folder / shard)
        names = [n for n in header if n != "__metadata__"]
        assert {n for n, f in index["weight_map"].items() if f == shard} == set(names)
        assert len(data) <= max_bytes or len(records_of(folder / shard)) == 1
        assert header["__metadata__"]["k"] == "v"
        stored_total += len(data)
    assert index["metadata"]["total_size"] == stored_total
    for name, value in mixed.items():  # the six parts of a W12 weight share one file
        if isinstance(value, w12.W12Tensor):
            files = {index["weight_map"][p] for p in container.component_names(name)}
            assert len(files) == 1
    reader = container.FolderReader(folder)
    assert reader.metadata == {"k": "v"}
    check_round_trip(dict(reader.items()), mixed)


def test_tensor_larger_than_a_shard_gets_its_own(tmp_path):
    tensors = {"a": torch.zeros(10, dtype=torch.uint8), "big.weight": w12.encode(weights(8, 64, 1)),
               "b": torch.zeros(10, dtype=torch.uint8)}
    folder = write(tmp_path / "ckpt", tensors, max_shard_bytes=100)
    per_file = {p.name: [r["name"] for r in records_of(p)] for p in folder.glob("*.safetensors")}
    assert sorted(per_file.values()) == [["a"], ["b"], ["big.weight"]]
    check_round_trip(read_all(folder), tensors)


# ----------------------------------------------------------------------------- narrow dtypes


def escapes_row(k: int, escapes: int) -> torch.Tensor:
    """One row of ones with ``escapes`` zeros at its start: exactly that many escapes."""
    bits = np.full((1, k), 0x3F80, np.uint16)
    bits[0, :escapes] = 0
    return bf16(bits)


@pytest.mark.parametrize("k, escapes, rowptr, col", [
    (300, 255, "U8", "U16"), (300, 256, "U16", "U16"), (256, 1, "U8", "U8"),
    (257, 1, "U8", "U16"), (65536, 0, "U8", "U16"), (65537, 1, "U8", "U32"),
    (65536, 65535, "U16", "U16"), (65536, 65536, "U32", "U16"),
], ids=lambda v: str(v))
def test_narrow_index_dtypes(tmp_path, k, escapes, rowptr, col):
    source = escapes_row(k, escapes)
    encoded = w12.encode(source)
    assert encoded.num_escapes == escapes
    folder = write(tmp_path / "ckpt", {"m.weight": encoded})
    header, data, _ = parse_file(folder / "model.safetensors")
    assert header["m.w12_esc_rowptr"]["dtype"] == rowptr
    assert header["m.w12_esc_col"]["dtype"] == col
    assert header["m.w12_esc_val"]["dtype"] == "I16"
    assert len(data) == encoded.nbytes == spec.storage_nbytes(1, k, escapes)
    got = container.FolderReader(folder).read("m.weight")
    assert_same_w12(got, encoded)
    assert same_bits(got.decode(), source)


@pytest.mark.parametrize("n, k, seed", [(1, 1, 0), (3, 7, 1), (17, 300, 2), (64, 64, 3)])
def test_nbytes_equals_bytes_written(tmp_path, n, k, seed):
    encoded = w12.encode(weights(n, k, seed, escapes=n))
    folder = write(tmp_path / "ckpt", {"p.weight": encoded, "bias": torch.zeros(3)})
    header, _, length = parse_file(folder / "model.safetensors")
    parts = [header[name]["data_offsets"] for name in container.component_names("p.weight")]
    assert sum(end - begin for begin, end in parts) == encoded.nbytes
    assert (folder / "model.safetensors").stat().st_size == 8 + length + encoded.nbytes + 12
    assert container.FolderReader(folder).info("p.weight").stored_nbytes == encoded.nbytes


# ----------------------------------------------------------------------------- golden bytes

# FORMAT.md, section 5: the worked example, every plane computed by hand.
EXAMPLE_BITS = [[0x3FDB, 0xBEA7, 0x4059, 0x0000, 0xB580], [0x0000, 0x8000, 0x0001, 0x7FC1, 0xFF80]]
EXAMPLE_PLANES = {
    "hi": ("U8", [0x75, 0xE2, 0x7D, 0, 0, 0, 0, 0, 0, 0]),
    "lo": ("U8", [0x7B, 0x09, 0x00, 0, 0, 0]),
    "e0": ("U8", [113, 1]),
    "esc_rowptr": ("U8", [0, 2, 7]),
    "esc_col": ("U8", [3, 4, 0, 1, 2, 3, 4]),
    "esc_val": ("I16", [0x0000, 0xB580, 0x0000, 0x8000, 0x0001, 0x7FC1, 0xFF80]),
}


def example_folder(folder: Path) -> Path:
    return write(folder, {"proj.weight": w12.encode(bf16(EXAMPLE_BITS)),
                          "norm.weight": torch.tensor([1.0, -2.0], dtype=torch.bfloat16)})


def expected_example_file() -> bytes:
    """The worked example's file, assembled from the hand-computed planes and FORMAT.md 8.1."""
    parts = {f"proj.w12_{f}": (code, np.array(values, np.uint16 if code == "I16" else np.uint8))
             for f, (code, values) in EXAMPLE_PLANES.items()}
    norm = np.array([0x3F80, 0xC000], np.uint16).tobytes()  # 1.0, -2.0
    blobs = {name: array.astype("<u2" if code == "I16" else "u1").tobytes()
             for name, (code, array) in parts.items()}
    crc = {name: f"{zlib.crc32(blob):08x}" for name, blob in blobs.items()}
    source_crc = f"{zlib.crc32(np.array(EXAMPLE_BITS, '<u2').tobytes()):08x}"
    shapes = {"proj.w12_hi": [2, 5], "proj.w12_lo": [2, 3], "proj.w12_e0": [2],
              "proj.w12_esc_rowptr": [3], "proj.w12_esc_col": [7], "proj.w12_esc_val": [7]}
    order = ["proj.w12_esc_val", "proj.w12_e0", "proj.w12_esc_col", "proj.w12_esc_rowptr",
             "proj.w12_hi", "proj.w12_lo"]  # I16 before U8, then by name
    records = (
        '[{"name":"proj.weight","kind":"w12","dtype":"BF16","shape":[2,5],"num_escapes":7,'
        f'"bf16_crc32":"{source_crc}","crc32":{{'
        + ",".join(f'"w12_{f}":"{crc["proj.w12_" + f]}"' for f in EXAMPLE_PLANES)
        + f'}}}},{{"name":"norm.weight","kind":"plain","dtype":"BF16","shape":[2],'
        f'"crc32":"{zlib.crc32(norm):08x}"}}]'
    )
    header = ('{"__metadata__":{"format":"pt","w12_format":"w12","w12_format_version":"1",'
              f'"w12_tensors":{json.dumps(records)}}},'
              '"norm.weight":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}')
    offset, data = 4, norm
    for name in order:
        size = len(blobs[name])
        header += (f',"{name}":{{"dtype":"{parts[name][0]}","shape":{json.dumps(shapes[name])},'
                   f'"data_offsets":[{offset},{offset + size}]}}').replace(" ", "")
        offset, data = offset + size, data + blobs[name]
    raw = (header + "}").encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def test_worked_example_planes():
    encoded = w12.encode(bf16(EXAMPLE_BITS))
    for field, (_, values) in EXAMPLE_PLANES.items():
        got = getattr(encoded, field).reshape(-1).tolist()
        want = [v - 65536 if field == "esc_val" and v >= 32768 else v for v in values]
        assert got == want, field


def test_golden_file_bytes(tmp_path):
    folder = example_folder(tmp_path / "ckpt")
    assert (folder / "model.safetensors").read_bytes() == expected_example_file()


def test_format_md_shows_the_real_example_file(tmp_path):
    folder = example_folder(tmp_path / "ckpt")
    header, data, length = parse_file(folder / "model.safetensors")
    text = (REPO / "FORMAT.md").read_text(encoding="utf-8")
    section = text[text.index("### 8.5"):text.index("### 8.6")]
    blocks = [b for b in section.split("\n\n") if b.startswith("    ")]
    shown_header = "".join(line.strip() for line in blocks[0].splitlines())
    raw = (folder / "model.safetensors").read_bytes()[8 : 8 + length].decode().rstrip(" ")
    assert shown_header == raw
    shown_data = bytes.fromhex(" ".join(line.strip().split("   ")[0]
                                        for line in blocks[1].splitlines()))
    assert shown_data == data
    assert f"H = {length}" in section and f"is {len(raw)} bytes" in section


DETERMINISM_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_container import determinism_tensors, write
write(Path(sys.argv[1]), determinism_tensors(), max_shard_bytes=300,
      metadata={"b": "1", "a": "2", "c": "3", "d": "4"})
"""


def determinism_tensors() -> dict:
    return {"a.weight": w12.encode(weights(16, 33, seed=3, escapes=9)),
            "n": torch.ones(4, dtype=torch.bfloat16), "z.weight": w12.encode(weights(2, 3, 4))}


def test_output_is_deterministic_across_processes(tmp_path):
    """A second process (other hash seed) writes the same bytes as this one."""
    write(tmp_path / "here", determinism_tensors(), max_shard_bytes=300,
          metadata={"d": "4", "c": "3", "b": "1", "a": "2"})
    env = dict(os.environ, PYTHONHASHSEED=str(1 + (hash("w12") & 0xFFFF)))
    subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT, str(tmp_path / "there"),
                    str(Path(__file__).parent)], check=True, env=env, cwd=REPO)
    digests = [{p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted((tmp_path / run).iterdir())} for run in ("here", "there")]
    assert len(digests[0]) == 3  # two shards and the index
    assert digests[0] == digests[1]


def test_layout_matches_the_safetensors_library(tmp_path):
    """Same stored tensors through safetensors.torch.save: same entries, order and data bytes."""
    encoded = w12.encode(weights(5, 300, seed=9, escapes=20))  # U16 columns
    folder = write(tmp_path / "ckpt", {"m.weight": encoded, "n": torch.ones(3)})
    ours, our_data, _ = parse_file(folder / "model.safetensors")
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    theirs_raw = safetensors_save(tensors, metadata=ours["__metadata__"])
    (length,) = struct.unpack("<Q", theirs_raw[:8])
    theirs = json.loads(theirs_raw[8 : 8 + length])
    assert ours == theirs
    assert list(ours) == list(theirs)[:1] + [k for k in theirs if k != "__metadata__"]
    assert our_data == theirs_raw[8 + length :]


# ----------------------------------------------------------------------------- checksums


def test_bf16_crc32_is_recorded_and_checked(tmp_path):
    source = weights(6, 10, seed=3)
    given = container.bf16_crc32(source)
    assert given == zlib.crc32(source.view(torch.int16).numpy().astype("<i2").tobytes())
    with container.FolderWriter(tmp_path / "a") as writer:
        writer.add("given.weight", w12.encode(source), bf16_crc32=given)
        writer.add("computed.weight", w12.encode(source))
    reader = container.FolderReader(tmp_path / "a")
    assert reader.info("given.weight").bf16_crc32 == given
    assert reader.info("computed.weight").bf16_crc32 == given
    reader.check_decode("given.weight")
    with container.FolderWriter(tmp_path / "b") as writer:
        writer.add("p.weight", w12.encode(source), bf16_crc32=given ^ 1)
    with raises_w12("model.safetensors", "tensor p.weight", "decoded BF16 checksum"):
        container.FolderReader(tmp_path / "b").check_decode("p.weight")


def test_checksum_mismatch_names_file_and_tensor(tmp_path, mixed):
    folder = write(tmp_path / "ckpt", mixed)
    path = folder / "model.safetensors"
    header, _, length = parse_file(path)
    begin, _ = header["model.layers.0.mlp.down_proj.w12_lo"]["data_offsets"]
    raw = bytearray(path.read_bytes())
    raw[8 + length + begin + 3] ^= 0x10
    path.write_bytes(bytes(raw))
    reader = container.FolderReader(folder)  # headers are fine; the data is checked on read
    reader.read("model.layers.0.self_attn.q_proj.weight")
    with raises_w12(str(path), "tensor model.layers.0.mlp.down_proj.weight", "checksum mismatch",
                    "model.layers.0.mlp.down_proj.w12_lo"):
        reader.read("model.layers.0.mlp.down_proj.weight")


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def sharded(tmp_path, mixed):
    return write(tmp_path / "ckpt", mixed, max_shard_bytes=1000)


def test_missing_shard(sharded):
    victim = sharded / "model-00002-of-00004.safetensors"
    holder = next(n for n, f in json.loads((sharded / container.INDEX_FILE).read_text())[
        "weight_map"].items() if f == victim.name)
    victim.unlink()
    with raises_w12(container.INDEX_FILE, victim.name, "is missing", f"tensor {holder}"):
        container.FolderReader(sharded)


def test_wrong_version_in_a_shard(sharded):
    path = sharded / "model-00003-of-00004.safetensors"
    header, data, _ = parse_file(path)
    header["__metadata__"]["w12_format_version"] = "7"
    write_header(path, header, data)
    with pytest.raises(W12Error) as info:
        container.FolderReader(sharded)
    assert str(info.value) == f"{path}: format version 7 is not supported (this reader knows 1)"


def test_wrong_version_in_the_index(sharded):
    path = sharded / container.INDEX_FILE
    index = json.loads(path.read_text())
    index["metadata"]["w12_format_version"] = "2"
    path.write_text(json.dumps(index))
    with raises_w12(str(path), "format version 2 is not supported (this reader knows 1)"):
        container.FolderReader(sharded)


def test_truncated_file(tmp_path, mixed):
    path = write(tmp_path / "ckpt", mixed) / "model.safetensors"
    raw = path.read_bytes()
    for size in (len(raw) - 1, len(raw) // 2, 9, 4, 0):
        path.write_bytes(raw[:size])
        with raises_w12(str(path)):
            container.FolderReader(path.parent)


def test_truncated_after_open(tmp_path, mixed):
    path = write(tmp_path / "ckpt", mixed) / "model.safetensors"
    reader = container.FolderReader(path.parent)
    path.write_bytes(path.read_bytes()[:-100])
    with raises_w12(str(path), "tensor mask", "file ends inside stored tensor mask"):
        reader.read("mask")


def test_foreign_safetensors_file(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    safetensors_save_file({"model.norm.weight": torch.ones(4, dtype=torch.bfloat16)},
                          folder / "model.safetensors", metadata={"format": "pt"})
    with raises_w12(str(folder / "model.safetensors"), "not a W12 checkpoint"):
        container.FolderReader(folder)


def test_shape_disagrees_with_metadata(tmp_path, mixed):
    path = write(tmp_path / "ckpt", mixed) / "model.safetensors"

    def widen(records):
        for record in records:
            if record["name"] == "lm_head.weight":
                record["shape"] = [11, 17]

    edit_records(path, widen)
    with raises_w12(str(path), "tensor lm_head.weight", "lm_head.w12_hi", "[11, 16]", "[11, 17]"):
        container.FolderReader(path.parent)


def test_plain_dtype_disagrees_with_metadata(tmp_path, mixed):
    path = write(tmp_path / "ckpt", mixed) / "model.safetensors"
    edit_records(path, lambda rs: [r.update(dtype="F16") for r in rs if r["name"] == "step"])
    with raises_w12(str(path), "tensor step", "I64", "F16"):
        container.FolderReader(path.parent)


def test_escape_count_disagrees_with_header(tmp_path, mixed):
    path = write(tmp_path / "ckpt", mixed) / "model.safetensors"
    edit_records(path, lambda rs: [r.update(num_escapes=r["num_escapes"] + 1)
                                   for r in rs if r["name"] == "lm_head.weight"])
    with raises_w12(str(path), "tensor lm_head.weight", "lm_head.w12_esc_col"):
        container.FolderReader(path.parent)


def test_random_bytes(tmp_path):
    folder = tmp_path / "junk"
    folder.mkdir()
    gen = np.random.default_rng(5)
    for size in (3, 8, 100, 5000):
        (folder / "model.safetensors").write_bytes(gen.bytes(size))
        with raises_w12(str(folder / "model.safetensors")):
            container.FolderReader(folder)


@pytest.mark.parametrize("garbage", [b"", b"{", b"[]", b'{"metadata": {}}', b"\xff\xfe",
                                     b'{"metadata": {}, "weight_map": {}, "metadata": {}}'])
def test_index_garbage(sharded, garbage):
    path = sharded / container.INDEX_FILE
    path.write_bytes(garbage)
    with raises_w12(str(path)):
        container.FolderReader(sharded)


def test_index_points_outside_the_folder(sharded):
    path = sharded / container.INDEX_FILE
    index = json.loads(path.read_text())
    index["weight_map"]["step"] = "../model-00001-of-00004.safetensors"
    path.write_text(json.dumps(index))
    with raises_w12(str(path), "tensor step", "not a .safetensors file name"):
        container.FolderReader(sharded)


def test_index_and_shards_disagree(sharded):
    path = sharded / container.INDEX_FILE
    index = json.loads(path.read_text())
    index["weight_map"]["mask"] = "model-00001-of-00004.safetensors"
    path.write_text(json.dumps(index))
    with raises_w12("tensor mask", container.INDEX_FILE):
        container.FolderReader(sharded)


def test_header_length_lies(tmp_path, mixed):
    path = write(tmp_path / "ckpt", mixed) / "model.safetensors"
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    for lie in (length + 8, len(raw), 2**63, 2**64 - 1, length - 8):
        path.write_bytes(struct.pack("<Q", lie) + raw[8:])
        with raises_w12(str(path)):
            container.FolderReader(path.parent)


def test_duplicate_keys_in_header(tmp_path):
    path = tmp_path / "ckpt" / "model.safetensors"
    path.parent.mkdir()
    raw = (b'{"__metadata__":{"w12_format":"w12","w12_format_version":"1","w12_tensors":"[]"},'
           b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
           b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}')
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0")
    with raises_w12(str(path), "duplicate key a"):
        container.FolderReader(path.parent)


def test_row_pointers_out_of_order_behind_a_good_checksum(tmp_path, mixed):
    path = write(tmp_path / "ckpt", mixed) / "model.safetensors"
    name = "model.layers.0.mlp.down_proj"

    def swap_two_pointers(chunk):
        inner = next(i for i in range(1, len(chunk) - 1) if chunk[i] < chunk[i + 1])
        chunk[inner], chunk[inner + 1] = chunk[inner + 1], chunk[inner]

    edit_data(path, f"{name}.w12_esc_rowptr", swap_two_pointers)
    with raises_w12(str(path), f"tensor {name}.weight", "row pointers decrease"):
        container.FolderReader(path.parent).read(f"{name}.weight")


CANONICAL_BREAKS = {  # id: (row of BF16 bits, plane, edit of its data, message)
    "escape_columns_out_of_order": ([0, 0x3F80, 0, 0x3F80, 0], "esc_col",
                                    lambda chunk: chunk.reverse(),
                                    "escape columns do not increase"),
    "escape_record_not_zero": ([0, 0x3F80, 0x3F80], "hi",
                               lambda chunk: chunk.__setitem__(0, 0x01),
                               "record (hi byte, lo nibble) is not 0"),
    "column_beyond_k": ([0, 0x3F80, 0x3F80], "esc_col",
                        lambda chunk: chunk.__setitem__(0, 200),
                        "escape column 200 outside [0, 3)"),
}


@pytest.mark.parametrize("case", list(CANONICAL_BREAKS))
def test_broken_planes_behind_a_good_checksum(tmp_path, case):
    row, plane, edit, message = CANONICAL_BREAKS[case]
    path = write(tmp_path / "ckpt", {"m.weight": w12.encode(bf16([row]))}) / "model.safetensors"
    edit_data(path, f"m.w12_{plane}", edit)
    with raises_w12(str(path), "tensor m.weight", message):
        container.FolderReader(path.parent).read("m.weight")


def test_folder_problems(tmp_path, mixed):
    with raises_w12(str(tmp_path / "nowhere"), "not a folder"):
        container.FolderReader(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with raises_w12("no model.safetensors or model.safetensors.index.json"):
        container.FolderReader(tmp_path / "empty")
    folder = write(tmp_path / "ckpt", mixed, max_shard_bytes=1000)
    (folder / "model.safetensors").write_bytes(b"")
    with raises_w12("holds both"):
        container.FolderReader(folder)


def test_unknown_tensor_name(tmp_path, mixed):
    reader = container.FolderReader(write(tmp_path / "ckpt", mixed))
    for call in (reader.read, reader.is_w12, reader.info):
        with raises_w12("no tensor named nope"):
            call("nope")
    with raises_w12("tensor step", "is not a W12 tensor"):
        reader.check_decode("step")


# ----------------------------------------------------------------------------- writer errors


def test_writer_refuses_bad_input(tmp_path):
    encoded = w12.encode(weights(2, 3, seed=0))
    with raises_w12("reserved"):
        container.FolderWriter(tmp_path / "a", metadata={"w12_x": "1"})
    with raises_w12("reserved"):
        container.FolderWriter(tmp_path / "a", metadata={"total_size": "1"})
    with raises_w12("str to str"):
        container.FolderWriter(tmp_path / "a", metadata={"a": 1})
    with raises_w12("max_shard_bytes"):
        container.FolderWriter(tmp_path / "a", max_shard_bytes=0)
    writer = container.FolderWriter(tmp_path / "a")
    with raises_w12("<module>.weight", "proj"):
        writer.add("proj", encoded)
    with raises_w12("x.w12_hi", "must not end in .w12_hi"):
        writer.add("x.w12_hi", torch.zeros(2))
    with raises_w12("dtype torch.complex64"):
        writer.add("c", torch.zeros(2, dtype=torch.complex64))
    with raises_w12("expected a torch.Tensor or W12Tensor"):
        writer.add("n", np.zeros(2))
    writer.add("x.weight", encoded)
    with raises_w12("tensor x.weight added twice"):
        writer.add("x.weight", torch.zeros(2))
    writer.add("y.weight", torch.zeros(2))
    with raises_w12("tensor y.weight added twice"):
        writer.add("y.weight", encoded)
    writer.close()
    with raises_w12("writer is closed"):
        writer.add("y", torch.zeros(1))
    with raises_w12("already holds a checkpoint", "model.safetensors"):
        container.FolderWriter(tmp_path / "a")


def test_writer_refuses_a_malformed_w12_tensor(tmp_path):
    encoded = w12.encode(weights(2, 3, seed=0))
    broken = w12.W12Tensor(encoded.hi, encoded.lo, encoded.e0, encoded.esc_rowptr.int(),
                           encoded.esc_col, encoded.esc_val)
    with raises_w12("bad.weight", "esc_rowptr"):
        container.FolderWriter(tmp_path / "a").add("bad.weight", broken)


def test_writer_abandons_on_exception(tmp_path):
    folder = tmp_path / "a"
    with pytest.raises(RuntimeError), container.FolderWriter(folder, max_shard_bytes=10) as w:
        w.add("a", torch.zeros(20, dtype=torch.uint8))
        w.add("b", torch.zeros(20, dtype=torch.uint8))
        raise RuntimeError("converter failed")
    assert list(folder.iterdir()) == []


# ----------------------------------------------------------------------------- config.json


def test_quantization_config_round_trip():
    config = container.quantization_config(
        converted_modules=["model.layers.1.mlp.up_proj", "model.layers.0.mlp.up_proj"],
        lm_head_converted=True, embeddings_converted=False, lossless_relative_to="bf16_cast")
    assert config == {
        "quant_method": "w12", "format_version": 1,
        "converted_modules": ["model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj"],
        "lm_head_converted": True, "embeddings_converted": False,
        "lossless_relative_to": "bf16_cast"}
    parsed = container.parse_quantization_config(json.loads(json.dumps(config | {"extra": 1})))
    assert parsed.converted_modules == tuple(config["converted_modules"])
    assert parsed.lm_head_converted and not parsed.embeddings_converted
    assert parsed.lossless_relative_to == "bf16_cast" and parsed.format_version == 1


@pytest.mark.parametrize("change, fragment", [
    ({"quant_method": "gptq"}, "quant_method gptq"),
    ({"format_version": 2}, "format version 2 is not supported (this reader knows 1)"),
    ({"format_version": True}, "format version True"),
    ({"converted_modules": "all"}, "converted_modules"),
    ({"lm_head_converted": "yes"}, "lm_head_converted"),
    ({"lossless_relative_to": "fp32"}, "lossless_relative_to fp32"),
])
def test_quantization_config_refuses(change, fragment):
    config = container.quantization_config(converted_modules=["a"], lm_head_converted=False,
                                           embeddings_converted=False,
                                           lossless_relative_to="source")
    with raises_w12("config.json: quantization_config", fragment):
        container.parse_quantization_config(config | change,
                                            where="config.json: quantization_config")
    arguments = {k: v for k, v in (config | change).items()
                 if k not in ("quant_method", "format_version")}
    if set(change) <= set(arguments):
        with raises_w12("quantization_config", fragment):
            container.quantization_config(**arguments)
