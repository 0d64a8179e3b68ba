"""Small Llama-shaped Hugging Face folders built in a temporary directory, and a few checks.

A module of its own (not conftest) so that tests import it under a name no other folder uses.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 32, 4, 2, 48, 64, 2
HEAD_DIM = HIDDEN // HEADS


def llama_tensors(*, seed: int = 0, dtype=torch.bfloat16, lm_head: bool = True,
                  layers: int = LAYERS) -> dict[str, torch.Tensor]:
    """Random tensors with the names and shapes of a tiny LlamaForCausalLM, in HF order."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.05):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    tensors = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = rand(HIDDEN, HIDDEN)
        tensors[p + "self_attn.k_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        tensors[p + "self_attn.v_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        tensors[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HIDDEN)
        tensors[p + "mlp.gate_proj.weight"] = rand(FFN, HIDDEN)
        tensors[p + "mlp.up_proj.weight"] = rand(FFN, HIDDEN)
        tensors[p + "mlp.down_proj.weight"] = rand(HIDDEN, FFN)
        tensors[p + "input_layernorm.weight"] = (1 + rand(HIDDEN)).to(dtype)
        tensors[p + "post_attention_layernorm.weight"] = (1 + rand(HIDDEN)).to(dtype)
    tensors["model.norm.weight"] = (1 + rand(HIDDEN)).to(dtype)
    if lm_head:
        tensors["lm_head.weight"] = rand(VOCAB, HIDDEN)
    if dtype == torch.bfloat16:
        _plant_special_values(tensors["model.layers.0.self_attn.q_proj.weight"])
    return tensors


def _plant_special_values(w: torch.Tensor) -> None:
    """Escapes of every kind: zeros, a subnormal, infinities, NaN payloads, a huge value."""
    bits = w.view(torch.int16)
    for col, pattern in enumerate([0x0000, 0x8000, 0x0001, 0x7F80, 0xFF80, 0x7FC1, 0xFFFF,
                                   0x7F00, 0x0080]):
        bits[3, col] = pattern - (1 << 16) if pattern >= 1 << 15 else pattern


def llama_config(*, tied: bool) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
            "intermediate_size": FFN, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
            "tie_word_embeddings": tied, "torch_dtype": "bfloat16"}


def write_hf_folder(folder: Path, tensors: dict[str, torch.Tensor], *, shards: int = 1,
                    config: dict | None = None) -> Path:
    """A HF checkpoint folder: one file, or ``shards`` files plus the index, and side files."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i in range(shards):
            part = names[i::shards]
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({n: tensors[n] for n in part}, str(folder / file), metadata={"format": "pt"})
            weight_map.update({n: file for n in part})
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = config if config is not None else llama_config(tied="lm_head.weight" not in tensors)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "extra.txt").write_text("side file in a subfolder\n")
    return folder


def folder_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (and its modification time), for untouched checks."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            + f"@{p.stat().st_mtime_ns}" for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
