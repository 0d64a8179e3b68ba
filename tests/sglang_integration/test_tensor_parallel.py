"""SGLang's own layers with the W12 method, at TP=1 and simulated TP=2 and TP=4.

Each rank's module is built from SGLang's layer classes and loaded through SGLang's Llama
weight routing and default loader, twice: from the W12 checkpoint with the W12 method, and from
the BF16 source without quantization. SGLang's BF16 weights are the reference: each rank's W12
weight must decode to exactly the same bits (K/V head replication, odd column starts and the
LM head's vocabulary padding included), and ``apply`` must give exactly what ``F.linear`` gives
on them.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import sglang_model
import torch
import torch.nn.functional as F

RANKS = [(tp, rank) for tp in (1, 2, 4) for rank in range(tp)]
RANK_IDS = [f"tp{tp}-rank{rank}" for tp, rank in RANKS]


@pytest.fixture(scope="module")
def quant_config(checkpoints):
    from sglang_integration.method import W12Config

    _, w12_folder, _ = checkpoints
    config = json.loads((w12_folder / "config.json").read_text(encoding="utf-8"))
    return W12Config.from_config(config["quantization_config"])


@pytest.fixture(scope="module", params=RANKS, ids=RANK_IDS)
def rank_pair(request, checkpoints, quant_config):
    """(W12 module, BF16 module) of one rank."""
    tp, rank = request.param
    bf16_folder, w12_folder, _ = checkpoints
    return (sglang_model.loaded_rank(quant_config, w12_folder, rank, tp),
            sglang_model.loaded_rank(None, bf16_folder, rank, tp))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("name", sglang_model.LINEAR_LAYERS)
def test_rank_weight_decodes_to_sglang_bf16_shard(rank_pair, name):
    from sglang_integration.method import W12LinearMethod
    from w12_kernels.gemm import decode_weight

    w12_layer = rank_pair[0].get_submodule(name)
    reference = rank_pair[1].get_submodule(name).weight
    assert isinstance(w12_layer.quant_method, W12LinearMethod)
    assert torch.equal(_bits(decode_weight(w12_layer.w12_weight)), _bits(reference))
    # the checkpoint-layout planes are freed once repacked
    assert all(getattr(w12_layer, f"w12_{part}").numel() == 0
               for part in ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val"))


@pytest.mark.parametrize("name", sglang_model.LINEAR_LAYERS)
def test_apply_equals_reference_linear(rank_pair, name):
    w12_layer = rank_pair[0].get_submodule(name)
    reference = rank_pair[1].get_submodule(name)
    k = reference.weight.shape[1]
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(k)).to(torch.bfloat16)
    bias = getattr(reference, "bias", None)
    got = w12_layer.quant_method.apply(w12_layer, x, w12_layer.bias if bias is not None else None)
    assert torch.equal(_bits(got), _bits(F.linear(x, reference.weight, bias)))


def test_apply_keeps_batch_invariance_only_up_to_64_rows(rank_pair, monkeypatch):
    """Under SGLang no row has to match another batch size's bits, so ``apply`` lets 65..128
    rows take the large-M path (``invariant_rows=64``; on an H200 1.4-1.7x as fast)."""
    from sglang_integration import method

    seen = []
    real = method.w12_linear

    def spy(x, w, bias=None, **kwargs):
        seen.append(kwargs)
        return real(x, w, bias, **kwargs)

    monkeypatch.setattr(method, "w12_linear", spy)
    layer = rank_pair[0].get_submodule(sglang_model.LINEAR_LAYERS[0])
    x = torch.randn(3, layer.w12_weight.k).to(torch.bfloat16)
    layer.quant_method.apply(layer, x)
    assert seen == [{"invariant_rows": 64}]


def test_logits_processor_runs_the_w12_lm_head(rank_pair):
    from sglang.srt.layers.logits_processor import LogitsProcessor

    hidden = torch.randn(4, 40, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    processor = SimpleNamespace(use_fp32_lm_head=False, rl_on_policy_target=None)
    logits = LogitsProcessor._compute_lm_head(processor, hidden, rank_pair[0].lm_head)
    expected = LogitsProcessor._compute_lm_head(processor, hidden, rank_pair[1].lm_head)
    assert torch.equal(_bits(logits), _bits(expected))


def test_plain_tensors_load_unchanged(rank_pair):
    w12_model, bf16_model = rank_pair
    for name in ("model.embed_tokens.weight", "model.norm.weight", "extra.column.bias"):
        assert torch.equal(_bits(w12_model.get_parameter(name)),
                           _bits(bf16_model.get_parameter(name)))


def test_layer_forward_at_tp1(checkpoints, quant_config):
    bf16_folder, w12_folder, _ = checkpoints
    w12_model = sglang_model.loaded_rank(quant_config, w12_folder, 0, 1)
    bf16_model = sglang_model.loaded_rank(None, bf16_folder, 0, 1)
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for name in ("model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj",
                 "extra.column", "extra.replicated"):
        got, _ = w12_model.get_submodule(name)(x)
        want, _ = bf16_model.get_submodule(name)(x)
        assert torch.equal(_bits(got), _bits(want)), name
