"""Hugging Face safetensors folder -> W12 folder.

Every 2-D ``*.weight`` (a linear layer's weight) becomes a W12 tensor; embeddings and the LM head
only when asked, because serving engines often keep them in BF16 for gathers and the final
projection. Everything else (norms, biases, buffers) is copied as stored. The source is read one
tensor at a time and the container writes shard by shard, so memory stays near the largest tensor
times three plus one shard. The output is built in a temporary folder and renamed into place
(``converters.atomic``); the source folder is only read. Every other file (config, tokenizer,
templates) is copied, and ``config.json`` gains a ``quantization_config`` entry.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import w12
from converters.atomic import output_folder
from converters.source import HFCheckpoint, TensorEntry
from w12 import container
from w12.errors import W12Error

DEFAULT_MAX_SHARD_BYTES = 2 * 10**9
_WIDE_FLOATS = (torch.float32, torch.float16, torch.float64)
_LM_HEAD_MODULES = ("lm_head", "embed_out")


@dataclass(frozen=True)
class ConvertOptions:
    """What to convert and how; the defaults are what ``w12 convert`` does without flags."""

    embeddings: bool = False
    lm_head: bool = False
    cast_to_bf16: bool = False
    force: bool = False
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
    keep: tuple[str, ...] = ()  # fnmatch patterns of tensor names left as they are (BF16)


@dataclass(frozen=True)
class ConvertReport:
    """Counts and sizes of one conversion (tensor data only, not file headers)."""

    src: Path
    dst: Path
    tensors: int
    converted: int
    cast: int
    source_bytes: int
    output_bytes: int
    converted_elements: int
    converted_bf16_bytes: int
    converted_w12_bytes: int
    escapes: int
    lossless_relative_to: str
    seconds: float

    @property
    def bits_per_weight(self) -> float:
        """Bits per weight of the converted tensors, every stored byte counted."""
        return 8.0 * self.converted_w12_bytes / max(self.converted_elements, 1)

    @property
    def escape_rate(self) -> float:
        return self.escapes / max(self.converted_elements, 1)


def is_lm_head(name: str) -> bool:
    module = name.rsplit(".", 1)[0]
    return module.split(".")[-1] in _LM_HEAD_MODULES


def is_embedding(name: str) -> bool:
    modules = name.split(".")[:-1]
    return not is_lm_head(name) and any("embed" in m or m in ("wte", "wpe") for m in modules)


def should_convert(entry: TensorEntry, options: ConvertOptions) -> bool:
    """A 2-D ``*.weight`` that is BF16 (or cast to it); embeddings/LM head only when asked;
    never one whose name matches a ``keep`` pattern (e.g. ``*.experts.*``: MoE experts left
    BF16 for a server that cannot run them as W12)."""
    if not entry.name.endswith(".weight") or len(entry.shape) != 2 or entry.numel == 0:
        return False
    if any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in options.keep):
        return False
    if entry.dtype != torch.bfloat16 and not (options.cast_to_bf16 and entry.dtype in _WIDE_FLOATS):
        return False
    if is_lm_head(entry.name):
        return options.lm_head
    if is_embedding(entry.name):
        return options.embeddings
    return True


def convert_folder(*, src: Path, dst: Path, options: ConvertOptions = ConvertOptions(),
                   progress: bool = True) -> ConvertReport:
    """Convert the HF checkpoint folder ``src`` into the W12 folder ``dst`` (see module doc)."""
    started = time.perf_counter()
    src, dst = Path(src), Path(dst)
    checkpoint = HFCheckpoint(src)
    _refuse_w12_source(checkpoint)
    _refuse_wide_floats(checkpoint, options)
    config = checkpoint.config()
    plan = [(e, should_convert(e, options)) for e in checkpoint.entries.values()]
    cast = sum(1 for e, _ in plan if e.dtype in _WIDE_FLOATS)
    relative_to = "bf16_cast" if cast else "source"
    with output_folder(dst, force=options.force, sources=(src,)) as tmp:
        stats = _write_tensors(checkpoint, plan, tmp, options, relative_to, progress)
        _copy_other_files(checkpoint, tmp)
        converted = [e.name for e, convert in plan if convert]
        _write_config(tmp, config, converted, relative_to, cast_happened=cast > 0)
    return ConvertReport(
        src=src, dst=dst, tensors=len(plan), converted=len(converted), cast=cast,
        lossless_relative_to=relative_to, seconds=time.perf_counter() - started, **stats,
    )


def _refuse_w12_source(checkpoint: HFCheckpoint) -> None:
    for entry in checkpoint.entries.values():
        if entry.name.endswith(tuple(f".{suffix}" for suffix in container.W12_SUFFIXES)):
            raise W12Error(f"{entry.file}: tensor {entry.name}: the source is already a W12 "
                           f"folder (use 'w12 decode' to get BF16 back)")


def _refuse_wide_floats(checkpoint: HFCheckpoint, options: ConvertOptions) -> None:
    if options.cast_to_bf16:
        return
    for entry in checkpoint.entries.values():
        if entry.dtype in _WIDE_FLOATS:
            dtype = str(entry.dtype).removeprefix("torch.")
            raise W12Error(
                f"{entry.file}: tensor {entry.name} is {dtype}; W12 is lossless for bfloat16 only "
                f"(pass --cast-to-bf16 to convert, lossless relative to the bfloat16 cast)"
            )


def _write_tensors(checkpoint: HFCheckpoint, plan, folder: Path, options: ConvertOptions,
                   relative_to: str, progress: bool) -> dict[str, int]:
    stats = dict(source_bytes=0, output_bytes=0, converted_elements=0, converted_bf16_bytes=0,
                 converted_w12_bytes=0, escapes=0)
    metadata = {"lossless_relative_to": relative_to, "converter": f"w12 {w12.__version__}"}
    writer = container.FolderWriter(folder, max_shard_bytes=options.max_shard_bytes,
                                    metadata=metadata)
    total = sum(entry.nbytes for entry, _ in plan)
    with tqdm(total=total, unit="B", unit_scale=True, desc="convert", disable=not progress) as bar:
        for entry, convert in plan:
            tensor = checkpoint.read(entry.name)
            if tensor.dtype in _WIDE_FLOATS:
                tensor = tensor.to(torch.bfloat16)  # RNE, the cast every framework performs
            stats["source_bytes"] += entry.nbytes
            if convert:
                encoded = w12.encode(tensor)
                # the source's own checksum, so the folder vouches for the original bits
                writer.add(entry.name, encoded, bf16_crc32=container.bf16_crc32(tensor))
                stats["output_bytes"] += encoded.nbytes
                stats["converted_elements"] += entry.numel
                stats["converted_bf16_bytes"] += 2 * entry.numel
                stats["converted_w12_bytes"] += encoded.nbytes
                stats["escapes"] += encoded.num_escapes
            else:
                writer.add(entry.name, tensor)
                stats["output_bytes"] += tensor.numel() * tensor.element_size()
            del tensor
            bar.update(entry.nbytes)
    writer.close()
    return stats


def _copy_other_files(checkpoint: HFCheckpoint, folder: Path) -> None:
    for relative in checkpoint.other_files():
        if relative == Path("config.json"):
            continue  # rewritten with quantization_config
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(checkpoint.folder / relative, target)  # follows hub-cache symlinks


def _write_config(folder: Path, config: dict | None, converted: list[str], relative_to: str, *,
                  cast_happened: bool) -> None:
    config = dict(config or {})
    config["quantization_config"] = container.quantization_config(
        converted_modules=[name.removesuffix(".weight") for name in converted],
        embeddings_converted=any(is_embedding(name) for name in converted),
        lm_head_converted=any(is_lm_head(name) for name in converted),
        lossless_relative_to=relative_to,
    )
    if cast_happened:
        for key in ("torch_dtype", "dtype"):
            if key in config:
                config[key] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
