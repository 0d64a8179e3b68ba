"""Fixtures for the engine tests: tiny random HF-layout checkpoints and the real demo model.

Tiny checkpoints (config.json + model.safetensors) cover the architecture flags: Llama with
llama3 RoPE scaling, Llama with tied embeddings, Qwen2 with q/k/v bias, Qwen3 with QK-norm and
a head_dim that differs from hidden/heads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.model import ModelArgs
from engine.weights import expected_shapes

_BASE = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 160,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2,
}

TINY_CONFIGS = {
    "llama": {**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "rope_theta": 500000.0, "tie_word_embeddings": False,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
    "llama-tied": {**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "rope_theta": 10000.0, "tie_word_embeddings": True},
    "qwen2": {**_BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "rope_theta": 1000000.0, "tie_word_embeddings": False,
              "use_sliding_window": False},
    "qwen3": {**_BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "head_dim": 32, "rope_theta": 1000000.0, "tie_word_embeddings": False,
              "use_sliding_window": False},
}
KINDS = list(TINY_CONFIGS)


def random_state(config: dict, *, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in expected_shapes(ModelArgs.from_hf_config(config)).items():
        values = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight"):
            values = 1.0 + 0.1 * values
        elif name.endswith(".bias"):
            values = 0.1 * values
        else:
            values = values * (0.5 / shape[-1] ** 0.5 if "proj" in name else 0.5)
        state[name] = values.to(dtype).contiguous()
    return state


def write_tiny_folder(folder: Path, kind: str, *, seed: int = 0,
                      dtype: torch.dtype = torch.float32, state_edit=None, **overrides) -> Path:
    """Write a tiny checkpoint; ``state_edit(state)`` may change the tensors before saving."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**TINY_CONFIGS[kind], **overrides, "torch_dtype": str(dtype).split(".")[-1]}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    state = random_state(config, seed=seed, dtype=dtype)
    if state_edit is not None:
        state_edit(state)
    save_file(state, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def tiny_folder(tmp_path):
    """``tiny_folder(kind, **options)`` -> a fresh tiny checkpoint folder."""
    counter = iter(range(1000))

    def make(kind: str, **options) -> Path:
        return write_tiny_folder(tmp_path / f"{kind}-{next(counter)}", kind, **options)

    return make


@pytest.fixture(scope="module")
def tiny_llama_folder(tmp_path_factory) -> Path:
    """One tiny Llama checkpoint for a whole test module."""
    return write_tiny_folder(tmp_path_factory.mktemp("target") / "llama", "llama")


@pytest.fixture(scope="session")
def demo_bf16() -> Path:
    from converters.demo_models import demo_hf_folder

    return demo_hf_folder(progress=False)


@pytest.fixture(scope="session")
def demo_w12(demo_bf16, tmp_path_factory) -> Path:
    from converters.hf import ConvertOptions, convert_folder

    dst = tmp_path_factory.mktemp("demo") / "w12"
    convert_folder(src=demo_bf16, dst=dst, options=ConvertOptions(), progress=False)
    return dst
