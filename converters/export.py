"""W12 folder -> plain BF16 Hugging Face folder, bit-identical to the converted source.

Each W12 tensor is decoded and each plain tensor copied, one at a time, into HF-named safetensors
shards (``converters.hf_writer``). The other files come along, and ``config.json`` loses its
``quantization_config`` so that any loader reads the result as an ordinary checkpoint. Like every
converter it writes into a temporary folder and renames it into place.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from converters.atomic import output_folder
from converters.hf import DEFAULT_MAX_SHARD_BYTES
from converters.hf_writer import HFShardWriter
from converters.source import other_files
from w12 import container
from w12.jsonio import read_json


@dataclass(frozen=True)
class DecodeReport:
    src: Path
    dst: Path
    tensors: int
    decoded: int
    output_bytes: int
    shards: int
    seconds: float


def decode_folder(*, src: Path, dst: Path, force: bool = False,
                  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                  progress: bool = True) -> DecodeReport:
    """Write the BF16 HF checkpoint that the W12 folder ``src`` encodes into ``dst``."""
    started = time.perf_counter()
    src, dst = Path(src), Path(dst)
    reader = container.FolderReader(src)
    names = reader.names()
    decoded = 0
    with output_folder(dst, force=force, sources=(src,)) as tmp:
        writer = HFShardWriter(tmp, max_shard_bytes=max_shard_bytes)
        for name in tqdm(names, desc="decode", unit="tensor", disable=not progress):
            value = reader.read(name)
            if reader.is_w12(name):
                value = value.decode()
                decoded += 1
            writer.add(name, value)
        shards = writer.close()
        _copy_other_files(src, tmp)
    return DecodeReport(src=src, dst=dst, tensors=len(names), decoded=decoded,
                        output_bytes=writer.total_bytes, shards=len(shards),
                        seconds=time.perf_counter() - started)


def _copy_other_files(src: Path, folder: Path) -> None:
    for relative in other_files(src):
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative == Path("config.json"):
            _write_plain_config(src / relative, target)
        else:
            shutil.copyfile(src / relative, target)


def _write_plain_config(path: Path, target: Path) -> None:
    config = read_json(path)
    if isinstance(config, dict):
        config.pop("quantization_config", None)
    target.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
