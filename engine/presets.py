"""Named model shapes, written as the Hugging Face ``config.json`` of the real model.

A preset goes through ``ModelArgs.from_hf_config`` like any folder, so a synthetic model runs the
same code as the checkpoint it imitates. ``synthetic:<name>`` on the command line builds one
with random weights (``engine.weights.build_synthetic``).
"""

from __future__ import annotations

from w12.errors import W12Error

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _qwen3(hidden: int, layers: int, heads: int, inter: int, tie: bool, max_pos: int = 40960):
    return {
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": inter, "vocab_size": 151936, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": max_pos, "tie_word_embeddings": tie,
        "bos_token_id": 151643, "eos_token_id": 151645,
    }


def _hybrid(hidden: int, layers: int, heads: int, inter: int, gdn: tuple[int, int, int, int],
            vocab: int = 151936, kv_heads: int = 8, head_dim: int = 128, every: int = 4) -> dict:
    """A dense hybrid: per ``every`` layers, ``every - 1`` GDN layers then one attention layer
    (Qwen3-style, q/k norms); GDN key heads, value heads, key and value head dims ``gdn``."""
    return {
        "architectures": ["W12HybridForCausalLM"], "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": inter,
        "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "layer_types": ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                        for i in range(layers)],
        "linear_num_key_heads": gdn[0], "linear_num_value_heads": gdn[1],
        "linear_key_head_dim": gdn[2], "linear_value_head_dim": gdn[3],
        "linear_conv_kernel_dim": 4,
    }


PRESETS: dict[str, dict] = {
    # the reference system's 27B hybrid target's shape: 64 layers, 48 GDN + 16 attention,
    # hidden 5120 (attention heads as Qwen3-32B's, so that head dim 128 fits tree attention)
    "hybrid-27b": _hybrid(5120, 64, 64, 17408, (16, 48, 128, 128)),
    "qwen3-8b": _qwen3(4096, 36, 32, 12288, tie=False),
    "qwen3-32b": _qwen3(5120, 64, 64, 25600, tie=False),
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001,
    },
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "max_position_embeddings": 8192, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2,
    },
    # Small enough for CPU tests of the synthetic path.
    "tiny-qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "vocab_size": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
    },
    "tiny-hybrid": _hybrid(64, 4, 4, 128, (2, 4, 16, 16), vocab=256, kv_heads=2, head_dim=16),
}


def preset_config(name: str) -> dict:
    key = name.lower()
    if key not in PRESETS:
        raise W12Error(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})")
    return dict(PRESETS[key])
