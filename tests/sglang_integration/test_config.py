"""``W12Config``: what SGLang reads from a converted checkpoint, and what it refuses."""

from __future__ import annotations

import pytest
import torch
from sglang_checkpoint import weight

import w12
from w12.errors import W12Error


def _config(converted, packed=None):
    from sglang_integration.method import W12Config

    return W12Config.from_config({
        "quant_method": "w12", "format_version": 1, "converted_modules": converted,
        "lm_head_converted": "lm_head" in converted, "embeddings_converted": False,
        "lossless_relative_to": "source", "packed_modules_mapping": packed})


def _load_all(layer, encoded, shard_id=None):
    for part in ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val"):
        param = getattr(layer, f"w12_{part}")
        param.weight_loader(param, getattr(encoded, part), shard_id)


def _column(config, prefix="m.proj", **kwargs):
    from sglang.srt.layers.linear import ColumnParallelLinear

    return ColumnParallelLinear(8, 6, bias=False, params_dtype=torch.bfloat16,
                                quant_config=config, prefix=prefix, tp_rank=0, tp_size=1,
                                **kwargs)


def _qkv(config):
    from sglang.srt.layers.linear import QKVParallelLinear

    return QKVParallelLinear(8, 2, 2, 1, bias=False, params_dtype=torch.bfloat16,
                             quant_config=config, prefix="m.qkv_proj", tp_rank=0, tp_size=1)


def test_sglang_detects_and_builds_w12_from_a_converted_folder(checkpoints):
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config

    from sglang_integration.method import W12Config
    from sglang_integration.plugin import register
    from w12.container import FolderReader

    register()
    _, w12_folder, _ = checkpoints
    model_config = ModelConfig(model_path=str(w12_folder))
    assert model_config.quantization == "w12"
    config = _get_quantization_config(model_config, LoadConfig())
    assert isinstance(config, W12Config)
    reader = FolderReader(w12_folder)
    stored = {name.removesuffix(".weight") for name in reader.names() if reader.is_w12(name)}
    assert set(config.checkpoint.converted_modules) == stored
    assert config.checkpoint.lm_head_converted


def test_method_description():
    from sglang_integration.method import W12Config

    config = _config(["m.proj"])
    assert config.get_name() == "w12"
    assert config.get_supported_act_dtypes() == [torch.bfloat16]
    assert W12Config.get_min_capability() == 80
    assert W12Config.get_config_filenames() == []
    assert config.get_scaled_act_names() == []


def test_needs_the_checkpoint_config():
    from sglang_integration.method import W12Config

    with pytest.raises(W12Error, match="written by 'w12 convert'"):
        W12Config()
    with pytest.raises(W12Error, match="quant_method fp8 is not w12"):
        W12Config.from_config({"quant_method": "fp8"})


def test_unconverted_layers_stay_sglang_bf16():
    from sglang.srt.layers.quantization.unquant import (
        UnquantizedEmbeddingMethod,
        UnquantizedLinearMethod,
    )
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
    from sglang.srt.runtime_context import get_parallel

    config = _config(["m.other"])
    assert isinstance(_column(config).quant_method, UnquantizedLinearMethod)
    with get_parallel().override(tp_rank=0, tp_size=1):
        head = ParallelLMHead(16, 8, params_dtype=torch.bfloat16, quant_config=config,
                              prefix="lm_head")
    assert isinstance(head.quant_method, UnquantizedEmbeddingMethod)
    assert config.get_quant_method(torch.nn.Module(), "m.attn") is None


def test_fused_layer_parts_follow_packed_modules_mapping():
    from sglang.srt.layers.linear import MergedColumnParallelLinear

    from sglang_integration.method import W12LinearMethod

    config = _config(["m.w1", "m.w3"], packed={"w13": ["w1", "w3"]})
    layer = MergedColumnParallelLinear(8, [4, 4], bias=False, params_dtype=torch.bfloat16,
                                       quant_config=config, prefix="m.w13", tp_rank=0, tp_size=1)
    assert isinstance(layer.quant_method, W12LinearMethod)
    assert layer.quant_method.checkpoint_modules == ["m.w1", "m.w3"]


def test_refuses_a_fused_layer_with_plain_parts():
    with pytest.raises(W12Error, match=r"m.qkv_proj: fused layer mixes .* \(plain: m.v_proj\)"):
        _qkv(_config(["m.q_proj", "m.k_proj"]))


def test_refuses_w12_embeddings_and_other_layer_types():
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from sglang.srt.runtime_context import get_parallel

    class OwnLinear(LinearBase):
        pass

    config = _config(["m.embed_tokens", "m.own", "m.experts.0.up_proj"])
    with get_parallel().override(tp_rank=0, tp_size=1), \
            pytest.raises(W12Error, match="m.embed_tokens: VocabParallelEmbedding weights"):
        VocabParallelEmbedding(16, 8, params_dtype=torch.bfloat16, quant_config=config,
                               prefix="m.embed_tokens")
    with pytest.raises(W12Error, match="m.experts: Module weights stored as W12"):
        config.get_quant_method(torch.nn.Module(), "m.experts")
    with pytest.raises(W12Error, match="m.own: W12 does not support layer type OwnLinear"):
        OwnLinear(8, 8, quant_config=config, prefix="m.own")


def test_refuses_presharded_checkpoints():
    with pytest.raises(W12Error, match="m.proj: .*pre-sharded checkpoints are not supported"):
        _column(_config(["m.proj"]), use_presharded_weights=True)


def test_loader_refuses_fused_checkpoint_tensors():
    layer = _qkv(_config(["m.q_proj", "m.k_proj", "m.v_proj"]))
    fused = w12.encode(weight((8, 8), seed=1))
    with pytest.raises(W12Error, match=r"no W12 shard None .*\['q', 'k', 'v'\]"):
        _load_all(layer, fused)


def test_loader_refuses_a_wrong_shape():
    layer = _qkv(_config(["m.q_proj", "m.k_proj", "m.v_proj"]))
    wrong = w12.encode(weight((4, 6), seed=2))
    with pytest.raises(W12Error, match=r"m.q_proj.w12_hi: checkpoint shape \(4, 6\), "
                                       r"expected \(4, 8\)"):
        _load_all(layer, wrong, "q")


def test_reports_a_tensor_that_was_never_loaded():
    layer = _qkv(_config(["m.q_proj", "m.k_proj", "m.v_proj"]))
    _load_all(layer, w12.encode(weight((4, 8), seed=3)), "q")
    _load_all(layer, w12.encode(weight((2, 8), seed=4)), "k")
    param = layer.w12_hi
    param.weight_loader(param, w12.encode(weight((2, 8), seed=5)).hi, "v")
    with pytest.raises(W12Error, match="m.v_proj.w12_lo was not loaded"):
        layer.quant_method.process_weights_after_loading(layer)


def test_refuses_to_reload_weights_in_place():
    from sglang.srt.model_loader.loader import DefaultModelLoader

    layer = _column(_config(["m.proj"]))
    _load_all(layer, w12.encode(weight((6, 8), seed=7)))
    DefaultModelLoader.postprocess_weights(layer, torch.device("cpu"))
    with pytest.raises(W12Error, match="m.proj: W12 weights cannot be reloaded in place"):
        DefaultModelLoader.restore_weights_before_loading(layer, torch.device("cpu"))


def test_reports_corrupt_planes_with_the_layer_name():
    layer = _column(_config(["m.proj"]))
    encoded = w12.encode(weight((6, 8), seed=6))
    _load_all(layer, encoded)
    layer.w12_e0.data[2] = 0  # below the format's smallest base exponent
    with pytest.raises(W12Error, match="m.proj: .*base exponent outside"):
        layer.quant_method.process_weights_after_loading(layer)


def test_checkpoint_planes_wait_on_the_host_while_loading():
    """SGLang builds models under its target device; the W12 checkpoint planes of every layer
    stay on the host until that layer is packed (before: every layer's planes sat on the GPU
    until post-processing, next to the packed weights made so far)."""
    with torch.device("meta"):
        layer = _column(_config(["m.proj"]))
    for part in ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val"):
        assert getattr(layer, f"w12_{part}").device == torch.device("cpu"), part
    assert layer.quant_method._device == torch.device("meta")  # the packed weight's device
    layer = _column(_config(["m.proj"]))
    encoded = w12.encode(weight((6, 8), seed=8))
    _load_all(layer, encoded)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.w12_weight.chunks.device == torch.device("cpu")
    assert layer.w12_hi.numel() == 0  # the checkpoint planes are freed once packed
