"""HF folder -> W12 folder: round trips, options, refusals, and the no-half-written-output rules."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest
import torch
from hf_fixtures import (
    assert_bits_equal,
    folder_hashes,
    llama_tensors,
    write_hf_folder,
)
from safetensors.torch import load_file

import w12
from converters import hf
from converters.export import decode_folder
from converters.hf import ConvertOptions, convert_folder
from converters.source import HFCheckpoint
from converters.verify import verify_folder
from w12.container import FolderReader
from w12.errors import W12Error


def _convert(src: Path, dst: Path, **options) -> hf.ConvertReport:
    return convert_folder(src=src, dst=dst, options=ConvertOptions(**options), progress=False)


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    reader = FolderReader(folder)
    out = {}
    for name in reader.names():
        value = reader.read(name)
        out[name] = value.decode() if reader.is_w12(name) else value
    return out


def _hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    checkpoint = HFCheckpoint(folder)
    return {name: checkpoint.read(name) for name in checkpoint.names()}


def _no_leftovers(parent: Path, name: str) -> None:
    assert not [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.")]


def test_single_file_round_trip(llama_folder: Path, tmp_path: Path):
    before = folder_hashes(llama_folder)
    dst = tmp_path / "w12"
    report = _convert(llama_folder, dst)
    source = load_file(str(llama_folder / "model.safetensors"))
    reader = FolderReader(dst)
    assert sorted(reader.names()) == sorted(source)
    linear = {n for n, t in source.items()
              if t.dim() == 2 and "embed" not in n and "lm_head" not in n}
    assert {n for n in reader.names() if reader.is_w12(n)} == linear
    assert report.converted == len(linear) and report.tensors == len(source)
    assert report.escapes > 0 and report.lossless_relative_to == "source"
    for name, value in _read_all(dst).items():
        assert_bits_equal(value, source[name])
    assert folder_hashes(llama_folder) == before  # the source is only read
    assert verify_folder(src=llama_folder, dst=dst, progress=False).ok


def test_side_files_and_quantization_config(llama_folder: Path, tmp_path: Path):
    dst = tmp_path / "w12"
    _convert(llama_folder, dst)
    assert (dst / "sub" / "extra.txt").read_text() == "side file in a subfolder\n"
    assert (dst / "tokenizer_config.json").read_bytes() == \
        (llama_folder / "tokenizer_config.json").read_bytes()
    config = json.loads((dst / "config.json").read_text())
    quant = config.pop("quantization_config")
    assert config == json.loads((llama_folder / "config.json").read_text())
    assert quant["quant_method"] == "w12" and quant["lossless_relative_to"] == "source"
    assert "model.layers.1.mlp.down_proj" in quant["converted_modules"]
    assert not quant["lm_head_converted"] and not quant["embeddings_converted"]


def test_keep_patterns_leave_tensors_as_they_are(llama_folder: Path, tmp_path: Path):
    """``--keep '*.mlp.*'``: the MLP weights stay BF16 (as MoE experts would for a server that
    cannot run them as W12), are absent from ``converted_modules`` and still round-trip."""
    dst = tmp_path / "w12"
    _convert(llama_folder, dst, keep=("*.mlp.*",))
    reader = FolderReader(dst)
    w12_names = {n for n in reader.names() if reader.is_w12(n)}
    assert w12_names and not any(".mlp." in n for n in w12_names)
    assert "model.layers.0.self_attn.q_proj.weight" in w12_names
    quant = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert not any(".mlp." in m for m in quant["converted_modules"])
    source = load_file(str(llama_folder / "model.safetensors"))
    for name, value in _read_all(dst).items():
        assert_bits_equal(value, source[name])


def test_sharded_round_trip_and_decode(tmp_path: Path):
    tensors = llama_tensors(seed=3)
    src = write_hf_folder(tmp_path / "src", tensors, shards=3)
    dst = tmp_path / "w12"
    _convert(src, dst, max_shard_bytes=8000)
    assert (dst / "model.safetensors.index.json").is_file()
    assert len(list(dst.glob("model-*-of-*.safetensors"))) > 1
    for name, value in _read_all(dst).items():
        assert_bits_equal(value, tensors[name])
    assert verify_folder(src=src, dst=dst, progress=False).ok
    out = tmp_path / "decoded"
    report = decode_folder(src=dst, dst=out, max_shard_bytes=10_000, progress=False)
    assert report.shards > 1 and report.decoded > 0
    decoded = _hf_tensors(out)
    assert sorted(decoded) == sorted(tensors)
    for name, value in decoded.items():
        assert_bits_equal(value, tensors[name])
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert (out / "sub" / "extra.txt").is_file()


def test_tied_embeddings_are_not_duplicated(tmp_path: Path):
    tensors = llama_tensors(lm_head=False)
    src = write_hf_folder(tmp_path / "src", tensors)
    dst = tmp_path / "w12"
    _convert(src, dst, embeddings=True, lm_head=True)
    reader = FolderReader(dst)
    assert "lm_head.weight" not in reader.names()
    assert reader.is_w12("model.embed_tokens.weight")
    assert json.loads((dst / "config.json").read_text())["tie_word_embeddings"] is True


def test_both_heads_stored_are_kept_as_stored(tmp_path: Path):
    tensors = llama_tensors()
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    src = write_hf_folder(tmp_path / "src", tensors)
    dst = tmp_path / "w12"
    _convert(src, dst, lm_head=True)
    reader = FolderReader(dst)
    assert reader.is_w12("lm_head.weight") and not reader.is_w12("model.embed_tokens.weight")
    decoded = _read_all(dst)
    assert_bits_equal(decoded["lm_head.weight"], tensors["lm_head.weight"])
    assert_bits_equal(decoded["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    quant = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert quant["lm_head_converted"] and not quant["embeddings_converted"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_wide_floats_refused_then_cast(tmp_path: Path, dtype):
    tensors = llama_tensors(dtype=dtype)
    src = write_hf_folder(tmp_path / "src", tensors)
    dst = tmp_path / "w12"
    with pytest.raises(W12Error) as info:
        _convert(src, dst)
    message = str(info.value)
    named = re.search(r"model\.safetensors: tensor (\S+) is (float\d+);", message)
    assert named and named.group(1) in tensors and named.group(2) == str(dtype)[6:]
    assert "\n" not in message and "--cast-to-bf16" in message
    assert not dst.exists()
    report = _convert(src, dst, cast_to_bf16=True)
    assert report.lossless_relative_to == "bf16_cast" and report.cast == len(tensors)
    for name, value in _read_all(dst).items():
        assert_bits_equal(value, tensors[name].to(torch.bfloat16))
    checked = verify_folder(src=src, dst=dst, progress=False)
    assert checked.ok and checked.lossless_relative_to == "bf16_cast"
    quant = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert quant["lossless_relative_to"] == "bf16_cast"


def test_force_rules(llama_folder: Path, tmp_path: Path):
    dst = tmp_path / "w12"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(W12Error, match="already exists"):
        _convert(llama_folder, dst)
    assert (dst / "keep.txt").read_text() == "mine"
    _convert(llama_folder, dst, force=True)
    assert not (dst / "keep.txt").exists() and (dst / "model.safetensors").is_file()
    _no_leftovers(tmp_path, "w12")
    for target in (llama_folder, llama_folder / "inner", tmp_path):
        with pytest.raises(W12Error, match="overlaps the source"):
            _convert(llama_folder, target, force=True)
    assert (llama_folder / "model.safetensors").is_file()


def test_interrupt_midway_leaves_nothing(llama_folder: Path, tmp_path: Path, monkeypatch):
    calls = []
    real_encode = w12.encode

    def encode_then_interrupt(t):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_encode(t)

    monkeypatch.setattr(hf.w12, "encode", encode_then_interrupt)
    before = folder_hashes(llama_folder)
    with pytest.raises(KeyboardInterrupt):
        _convert(llama_folder, tmp_path / "w12")
    assert len(calls) == 3
    assert not (tmp_path / "w12").exists()
    _no_leftovers(tmp_path, "w12")
    assert folder_hashes(llama_folder) == before


def test_shard_corrupted_midway_leaves_nothing(tmp_path: Path, monkeypatch):
    src = write_hf_folder(tmp_path / "src", llama_tensors(), shards=2)
    second = src / "model-00002-of-00002.safetensors"
    real_read = HFCheckpoint.read

    def read_and_corrupt(self, name):
        # once the first shard is done, the second shard is cut short on disk
        if self.entries[name].file == second and second.stat().st_size > 64:
            with open(second, "r+b") as f:
                f.truncate(second.stat().st_size - 64)
        return real_read(self, name)

    monkeypatch.setattr(HFCheckpoint, "read", read_and_corrupt)
    with pytest.raises(W12Error) as info:
        _convert(src, tmp_path / "w12")
    assert str(second) in str(info.value) and "tensor " in str(info.value)
    assert not (tmp_path / "w12").exists()
    _no_leftovers(tmp_path, "w12")


def test_missing_shard(tmp_path: Path):
    src = write_hf_folder(tmp_path / "src", llama_tensors(), shards=2)
    (src / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(W12Error, match="model-00002-of-00002.safetensors: shard listed"):
        _convert(src, tmp_path / "w12")
    assert not (tmp_path / "w12").exists()


def test_tensor_listed_in_index_but_absent(tmp_path: Path):
    src = write_hf_folder(tmp_path / "src", llama_tensors(), shards=2)
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(W12Error, match="model.layers.9.mlp.up_proj.weight listed in"):
        _convert(src, tmp_path / "w12")


def _rewrite_header(path: Path, edit) -> None:
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])


def test_shape_mismatch_in_header(llama_folder: Path, tmp_path: Path):
    def widen(header):
        header["model.layers.1.mlp.up_proj.weight"]["shape"] = [FFN_WIDE, 32]

    FFN_WIDE = 49
    _rewrite_header(llama_folder / "model.safetensors", widen)
    with pytest.raises(W12Error) as info:
        _convert(llama_folder, tmp_path / "w12")
    message = str(info.value)
    assert "model.safetensors" in message and "model.layers.1.mlp.up_proj.weight" in message
    assert "\n" not in message


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, os.urandom(4096),
                                     b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      "])
def test_corrupt_source_file(tmp_path: Path, content: bytes):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(content)
    with pytest.raises(W12Error, match="model.safetensors: not a readable safetensors file"):
        _convert(src, tmp_path / "w12")


def test_truncated_source_file(llama_folder: Path, tmp_path: Path):
    path = llama_folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(W12Error, match="model.safetensors: not a readable safetensors file"):
        _convert(llama_folder, tmp_path / "w12")


def test_folder_without_weights(tmp_path: Path):
    (tmp_path / "src").mkdir()
    with pytest.raises(W12Error, match="no model.safetensors"):
        _convert(tmp_path / "src", tmp_path / "w12")


def test_integer_buffers_and_odd_shapes_stay_plain(tmp_path: Path):
    tensors = {
        "encoder.dense.weight": (torch.randn(5, 7) * 0.1).bfloat16(),  # odd K
        "encoder.position_ids": torch.arange(12).reshape(1, 12),
        "encoder.conv.weight": torch.randn(4, 3, 2).bfloat16(),
        "encoder.dense.bias": torch.randn(5).bfloat16(),
    }
    src = write_hf_folder(tmp_path / "src", tensors, config={"model_type": "toy"})
    dst = tmp_path / "w12"
    _convert(src, dst)
    reader = FolderReader(dst)
    assert [n for n in reader.names() if reader.is_w12(n)] == ["encoder.dense.weight"]
    for name, value in _read_all(dst).items():
        assert_bits_equal(value, tensors[name])
