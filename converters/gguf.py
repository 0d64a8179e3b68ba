"""GGUF (llama.cpp) file -> BF16 Hugging Face Llama folder.

Every tensor is dequantised to float32 with the ``gguf`` package (``gguf.quants.dequantize``) and
rounded to BF16, renamed from llama.cpp's names to those of ``LlamaForCausalLM``, and written one at
a time into HF safetensors shards. GGUF lists dimensions fastest-first (``ne0`` is the row length),
so its shapes are reversed relative to PyTorch; the data itself is already row-major [out, in].
llama.cpp's HF->GGUF conversion reorders the rows of ``q_proj``/``k_proj`` from HF's "half split"
rotary layout to the interleaved one (per head: ``w.reshape(2, d/2, K).swapaxes(0, 1)``);
:func:`unpermute_rotary_rows` undoes it exactly. ``config.json`` comes from the GGUF hyper-
parameters, tokenizer files from its vocabulary (``converters.gguf_tokenizer``), and the config and
shard headers record that the weights are GGUF (which quantisation) dequantised to BF16.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from converters.atomic import output_folder
from converters.gguf_tokenizer import SPECIAL_TOKEN_KEYS, write_tokenizer_files
from converters.hf import DEFAULT_MAX_SHARD_BYTES
from converters.hf_writer import HFShardWriter
from w12.errors import W12Error

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
_SUPPORTED_ARCHITECTURES = ("llama",)


def hf_tensor_name(gguf_name: str) -> str:
    """The ``LlamaForCausalLM`` name of a llama.cpp tensor name; ``W12Error`` if there is none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_TENSOR.fullmatch(gguf_name)
    if match and match.group(2) in _BLOCK_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{int(layer)}.{_BLOCK_NAMES[part]}.{kind}"
    raise W12Error(f"tensor {gguf_name}: no Hugging Face Llama equivalent (not supported)")


def permute_rotary_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's HF->GGUF reordering of q/k rows: per head, half-split -> interleaved."""
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rotary_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Exact inverse of :func:`permute_rotary_rows`: interleaved rows back to HF's half-split."""
    if w.shape[0] % (2 * n_head):
        raise W12Error(f"{w.shape[0]} rows cannot be split into {n_head} rotary heads")
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_to_hf(*, src: Path, dst: Path, force: bool = False,
               max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, progress: bool = True) -> Path:
    """Write the BF16 HF Llama checkpoint equivalent to the GGUF file ``src`` into ``dst``."""
    src, dst = Path(src), Path(dst)
    reader = _open_reader(src)
    fields = read_fields(reader)
    arch = fields.get("general.architecture")
    if arch not in _SUPPORTED_ARCHITECTURES:
        raise W12Error(f"{src}: architecture {arch!r} is not supported (only Llama)")
    tensors = sorted(reader.tensors, key=lambda t: _hf_order(hf_tensor_name(t.name)))
    names = {t.name for t in tensors}
    config = llama_config(fields, tensors, tied=("output.weight" not in names))
    source = _source_record(src, fields, tensors)
    with output_folder(dst, force=force, sources=(src,)) as tmp:
        shard_metadata = {key: str(value) for key, value in source.items()
                          if not isinstance(value, dict)}
        writer = HFShardWriter(tmp, max_shard_bytes=max_shard_bytes, metadata=shard_metadata)
        for tensor in tqdm(tensors, desc="gguf->bf16", unit="tensor", disable=not progress):
            writer.add(hf_tensor_name(tensor.name), _bf16_tensor(src, tensor, config))
        writer.close()
        _write_json(tmp / "config.json", {**config, "w12_source": source})
        _write_json(tmp / "generation_config.json", _generation_config(config))
        write_tokenizer_files(tmp, fields, context_length=config["max_position_embeddings"])
    return dst


def read_fields(reader) -> dict:
    """All key/value metadata of a GGUF file as Python values (strings, numbers, lists)."""
    return {name: _field_value(field) for name, field in reader.fields.items()}


def llama_config(fields: dict, tensors, *, tied: bool) -> dict:
    """A ``LlamaForCausalLM`` config.json from the GGUF hyper-parameters."""
    arch = fields["general.architecture"]

    def need(key: str):
        if f"{arch}.{key}" not in fields:
            raise W12Error(f"GGUF metadata lacks {arch}.{key}")
        return fields[f"{arch}.{key}"]

    shapes = {t.name: _torch_shape(t) for t in tensors}
    if "token_embd.weight" not in shapes:
        raise W12Error("GGUF file has no token_embd.weight")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(fields.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(fields.get(f"{arch}.attention.key_length", hidden // heads)),
        "num_hidden_layers": int(need("block_count")),
        "rms_norm_eps": _clean_float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": _clean_float(fields.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "vocab_size": shapes["token_embd.weight"][0],
        "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "torch_dtype": "bfloat16", "use_cache": True,
    }
    for role in ("bos", "eos", "pad"):
        key = f"tokenizer.ggml.{SPECIAL_TOKEN_KEYS[role]}"
        if key in fields:
            config[f"{role}_token_id"] = int(fields[key])
    return config


def _bf16_tensor(src: Path, tensor, config: dict) -> torch.Tensor:
    from gguf.quants import dequantize

    try:
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        values = values.reshape(_torch_shape(tensor))
    except (NotImplementedError, ValueError) as exc:
        raise W12Error(f"{src}: tensor {tensor.name} ({tensor.tensor_type.name}): "
                       f"cannot dequantise ({exc})") from exc
    part = tensor.name.split(".")[-2] if tensor.name.startswith("blk.") else ""
    if part == "attn_q":
        values = unpermute_rotary_rows(values, config["num_attention_heads"])
    elif part == "attn_k":
        values = unpermute_rotary_rows(values, config["num_key_value_heads"])
    # a private copy: F32 data is a read-only view of the memory-mapped file
    values = np.array(values, dtype=np.float32, order="C", copy=True)
    # float32 -> bfloat16 rounds to nearest even, the cast every framework uses
    return torch.from_numpy(values).to(torch.bfloat16)


def _torch_shape(tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(tensor.shape))


def _hf_order(name: str) -> tuple:
    match = re.match(r"model\.layers\.(\d+)\.(.*)", name)
    if match:
        return (1, int(match.group(1)), match.group(2))
    return ({"model.embed_tokens.weight": 0, "model.norm.weight": 2}.get(name, 3), 0, name)


def _source_record(src: Path, fields: dict, tensors) -> dict:
    counts = Counter(t.tensor_type.name for t in tensors)
    return {"format": "gguf", "file": src.name, "file_type": _file_type(fields),
            "tensor_types": dict(sorted(counts.items())), "dequantized_to": "bfloat16"}


def _file_type(fields: dict) -> str:
    value = fields.get("general.file_type")
    if value is None:
        return "unknown"
    try:
        from gguf import LlamaFileType

        return LlamaFileType(int(value)).name
    except (ImportError, ValueError):
        return str(value)


def _generation_config(config: dict) -> dict:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {key: config[key] for key in keys if key in config}


def _open_reader(src: Path):
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise W12Error("reading GGUF files needs the gguf package (pip install gguf)") from exc
    if not src.is_file():
        raise W12Error(f"{src}: no such GGUF file")
    try:
        return GGUFReader(str(src))
    except Exception as exc:  # the reader raises ValueError/struct errors on foreign files
        reason = " ".join(str(exc).split())[:200]
        raise W12Error(f"{src}: not a readable GGUF file ({type(exc).__name__}: {reason})") from exc


def _field_value(field):
    """Decode a GGUF metadata field from its raw parts (works across gguf package versions)."""
    from gguf import GGUFValueType

    kind = field.types[0] if field.types else None

    def item(index: int, value_type):
        part = field.parts[index]
        if value_type == GGUFValueType.STRING:
            return bytes(part).decode("utf-8", errors="replace")
        return part.tolist()[0]

    if kind == GGUFValueType.ARRAY:
        element = field.types[1] if len(field.types) > 1 else None
        return [item(i, element) for i in field.data]
    if not field.data:
        return None
    return item(field.data[0], kind)


def _clean_float(value) -> float:
    # GGUF stores float32: 1e-5 reads back as 9.999999747378752e-06; print the float32 shortly
    return float(str(np.float32(value)))


def _write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
