"""A Llama-shaped module built from SGLang's own layers, for one simulated tensor-parallel rank.

SGLang's full ``LlamaForCausalLM`` needs attention and rotary kernels that do not run on a CPU,
so this holds just its weight-bearing layers, under the same names (``qkv_proj``,
``gate_up_proj``, ...), plus a plain column-parallel and a replicated layer. Weights go in
through SGLang's own ``LlamaForCausalLM.load_weights`` and ``DefaultModelLoader``, which route
checkpoint tensors (``q_proj`` -> shard ``"q"`` of ``qkv_proj``, ...) exactly as a server does.
The rank is set the way SGLang sets it: ``tp_rank``/``tp_size`` arguments for the linear layers
and the parallel context for the vocabulary layers.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from sglang_checkpoint import (
    EXTRA_COLUMN,
    EXTRA_REPLICATED,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    VOCAB,
)
from torch import nn

# the layers whose checkpoint weights are W12
LINEAR_LAYERS = (
    "model.layers.0.self_attn.qkv_proj",
    "model.layers.0.self_attn.o_proj",
    "model.layers.0.mlp.gate_up_proj",
    "model.layers.0.mlp.down_proj",
    "extra.column",
    "extra.replicated",
    "lm_head",
)


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16),
                                   requires_grad=False)


def _decoder_layer(quant_config, rank: dict) -> nn.Module:
    from sglang.srt.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )

    prefix = "model.layers.0"
    common = dict(bias=False, params_dtype=torch.bfloat16, quant_config=quant_config, **rank)
    layer = nn.Module()
    layer.self_attn = nn.Module()
    layer.self_attn.qkv_proj = QKVParallelLinear(
        HIDDEN, HEAD_DIM, HEADS, KV_HEADS, prefix=f"{prefix}.self_attn.qkv_proj", **common)
    layer.self_attn.o_proj = RowParallelLinear(
        HEADS * HEAD_DIM, HIDDEN, prefix=f"{prefix}.self_attn.o_proj", **common)
    layer.mlp = nn.Module()
    layer.mlp.gate_up_proj = MergedColumnParallelLinear(
        HIDDEN, [INTERMEDIATE] * 2, prefix=f"{prefix}.mlp.gate_up_proj", **common)
    layer.mlp.down_proj = RowParallelLinear(
        INTERMEDIATE, HIDDEN, prefix=f"{prefix}.mlp.down_proj", **common)
    layer.input_layernorm = _Norm()
    layer.post_attention_layernorm = _Norm()
    return layer


def _extra_layers(quant_config, rank: dict) -> nn.Module:
    from sglang.srt.layers.linear import ColumnParallelLinear, ReplicatedLinear

    extra = nn.Module()
    extra.column = ColumnParallelLinear(HIDDEN, EXTRA_COLUMN, bias=True,
                                        params_dtype=torch.bfloat16, quant_config=quant_config,
                                        prefix="extra.column", **rank)
    extra.replicated = ReplicatedLinear(HIDDEN, EXTRA_REPLICATED, bias=False,
                                        params_dtype=torch.bfloat16, quant_config=quant_config,
                                        prefix="extra.replicated")
    return extra


def _llama_root() -> nn.Module:
    """An empty module whose ``load_weights`` is ``LlamaForCausalLM``'s, unchanged."""
    from sglang.srt.models.llama import LlamaForCausalLM

    class LlamaWeights(nn.Module):
        load_weights = LlamaForCausalLM.load_weights
        _legacy_load_weights = LlamaForCausalLM._legacy_load_weights
        _load_weights_v2 = LlamaForCausalLM._load_weights_v2

    return LlamaWeights()


def build(quant_config, tp_rank: int, tp_size: int) -> nn.Module:
    """The module for rank ``tp_rank`` of ``tp_size``, weights not loaded yet."""
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from sglang.srt.runtime_context import get_parallel

    rank = dict(tp_rank=tp_rank, tp_size=tp_size)
    root = _llama_root()
    root.config = SimpleNamespace(tie_word_embeddings=False)
    root.model = nn.Module()
    with get_parallel().override(**rank):
        root.model.embed_tokens = VocabParallelEmbedding(
            VOCAB, HIDDEN, params_dtype=torch.bfloat16, quant_config=quant_config,
            prefix="model.embed_tokens")
        root.lm_head = ParallelLMHead(VOCAB, HIDDEN, params_dtype=torch.bfloat16,
                                      quant_config=quant_config, prefix="lm_head")
    root.model.layers = nn.ModuleList([_decoder_layer(quant_config, rank)])
    root.model.norm = _Norm()
    root.extra = _extra_layers(quant_config, rank)
    return root


def load(model: nn.Module, folder: Path) -> nn.Module:
    """Load ``folder`` into ``model`` the way SGLang's default loader does, then post-process."""
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
    files = sorted(str(path) for path in folder.glob("*.safetensors"))
    model.load_weights(safetensors_weights_iterator(files))
    DefaultModelLoader.postprocess_weights(model, torch.device("cpu"))
    return model


def loaded_rank(quant_config, folder: Path, tp_rank: int, tp_size: int) -> nn.Module:
    return load(build(quant_config, tp_rank, tp_size), folder)
