"""A tiny Llama checkpoint for the SGLang tests: BF16 source folder and its W12 conversion.

Sizes are awkward on purpose: with TP=4 the MLP's down projection gives each rank 13 input
columns, so three ranks start on an odd column (inside a lo byte) and every rank ends on half a
byte; 2 K/V heads are replicated across 4 ranks; the 250-token vocabulary leaves padding rows
in the last LM-head shard. Every weight has escapes (zeros, subnormals, infinities, NaNs, values
far outside their row's window) spread over all columns, so every rank gets some.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 40, 4, 2, 10, 52, 250
EXTRA_COLUMN, EXTRA_REPLICATED = 48, 24

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_hidden_layers": 1,
    "vocab_size": VOCAB,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

_LAYER = "model.layers.0"
SHAPES = {
    f"{_LAYER}.self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
    f"{_LAYER}.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
    f"{_LAYER}.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
    f"{_LAYER}.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
    f"{_LAYER}.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
    f"{_LAYER}.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
    f"{_LAYER}.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    "lm_head.weight": (VOCAB, HIDDEN),
    "model.embed_tokens.weight": (VOCAB, HIDDEN),
    # not Llama's: a plain column-parallel layer with a bias and a replicated layer
    "extra.column.weight": (EXTRA_COLUMN, HIDDEN),
    "extra.replicated.weight": (EXTRA_REPLICATED, HIDDEN),
}
_SPECIALS = torch.tensor([0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC1, 0xFFFF,
                          0x4E00, 0xCE80, 0x2000], dtype=torch.int32).to(torch.int16)


def weight(shape: tuple[int, int], seed: int, special_rate: float = 0.04) -> torch.Tensor:
    """Gaussian BF16 weights with ``special_rate`` of values W12 must store as escapes."""
    gen = torch.Generator().manual_seed(seed)
    values = (torch.randn(shape, generator=gen) * 0.05).to(torch.bfloat16)
    bits = values.view(torch.int16).clone()
    mask = torch.rand(shape, generator=gen) < special_rate
    picks = torch.randint(len(_SPECIALS), (int(mask.sum()),), generator=gen)
    bits[mask] = _SPECIALS[picks]
    return bits.view(torch.bfloat16)


def source_tensors() -> dict[str, torch.Tensor]:
    tensors = {name: weight(shape, seed) for seed, (name, shape) in enumerate(SHAPES.items())}
    for norm in (f"{_LAYER}.input_layernorm.weight", f"{_LAYER}.post_attention_layernorm.weight",
                 "model.norm.weight"):
        tensors[norm] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    tensors["extra.column.bias"] = weight((1, EXTRA_COLUMN), seed=99)[0]
    return tensors


def write_checkpoints(root: Path) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """Write the BF16 folder and its W12 conversion (LM head included); return both and the
    source tensors."""
    from converters.hf import ConvertOptions, convert_folder

    src, dst = root / "bf16", root / "w12"
    src.mkdir(parents=True)
    tensors = source_tensors()
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n", encoding="utf-8")
    convert_folder(src=src, dst=dst, options=ConvertOptions(lm_head=True), progress=False)
    return src, dst, tensors
