"""SGLang's real model classes (``LlamaForCausalLM``, ``Qwen3ForCausalLM``) on W12 weights on
the CPU, through SGLang's own loader and process groups, at TP 1 and 2: the logits equal the
BF16 model's bit for bit (``model_class_runner.py`` says what stands in for GPU-only parts)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

RUNNER = Path(__file__).parent / "model_class_runner.py"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 64, 4, 2, 16, 96, 256, 2
ARCH = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def weight(shape, seed: int) -> torch.Tensor:
    """Gaussian BF16 weights with escapes W12 must keep exact: zeros, values far below and far
    above their row's window (finite, so the logits stay comparable)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen) * 0.08
    pick = torch.rand(shape, generator=gen)
    w = torch.where(pick < 0.02, 0.0, w)
    w = torch.where((pick >= 0.02) & (pick < 0.03), w * 1e-12, w)
    w = torch.where((pick >= 0.03) & (pick < 0.035), w * 50.0, w)
    return w.to(torch.bfloat16)


def write_folders(root: Path, kind: str) -> tuple[Path, Path]:
    from converters.hf import ConvertOptions, convert_folder

    def ones(n: int = HIDDEN) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    tensors = {"model.embed_tokens.weight": weight((VOCAB, HIDDEN), 1) * 10,
               "model.norm.weight": ones(), "lm_head.weight": weight((VOCAB, HIDDEN), 2)}
    seed = 10
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
                  "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                  "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                  "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
                  "mlp.gate_proj.weight": (INTER, HIDDEN), "mlp.up_proj.weight": (INTER, HIDDEN),
                  "mlp.down_proj.weight": (HIDDEN, INTER)}
        for name, shape in shapes.items():
            seed += 1
            tensors[p + name] = weight(shape, seed)
        tensors[p + "input_layernorm.weight"] = ones()
        tensors[p + "post_attention_layernorm.weight"] = ones()
        if kind == "qwen3":
            tensors[p + "self_attn.q_norm.weight"] = ones(HEAD_DIM)
            tensors[p + "self_attn.k_norm.weight"] = ones(HEAD_DIM)
    config = {"architectures": [ARCH[kind]], "model_type": kind, "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": LAYERS,
              "vocab_size": VOCAB, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
    src, dst = root / f"{kind}-bf16", root / f"{kind}-w12"
    src.mkdir(parents=True)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    convert_folder(src=src, dst=dst, options=ConvertOptions(lm_head=True), progress=False)
    return src, dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(env, kind, bf16, w12, tp, extra=None) -> list[tuple[int, str, str]]:
    """(return code, stdout, stderr) of every rank of one run."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(RUNNER), kind, str(bf16), str(w12), str(tp),
                               str(rank), str(port), json.dumps(extra or {})], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(tp)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        results.append((proc.returncode, out, err))
    return results


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_sglang_model_class_logits_are_bf16_bits(tmp_path, subprocess_env, kind, tp):
    bf16, w12 = write_folders(tmp_path, kind)
    reports = []
    for code, out, err in run_ranks(subprocess_env, kind, bf16, w12, tp):
        assert code == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for report in reports:
        assert report["methods"] == {"bf16": "UnquantizedLinearMethod",
                                     "w12": "W12LinearMethod"}, report
        assert report["shape"] == [1, VOCAB] and report["finite"], report
        assert report["equal"], f"{kind} TP={tp}: W12 logits differ from BF16's: {report}"
        assert report["head_equal"], f"{kind} TP={tp}: get_embed_and_head's head differs"
        assert report["loader"] == "DefaultModelLoader"
    assert len({r["digest"] for r in reports}) == 1  # every rank holds the gathered logits


def test_an_fp32_lm_head_is_refused_at_load_with_the_reason(tmp_path, subprocess_env):
    """SGLang's --enable-fp32-lm-head hands the head float32 activations, which the W12 GEMM
    does not take: loading says so instead of failing at the first forward."""
    bf16, w12 = write_folders(tmp_path, "llama")
    [(code, _, err)] = run_ranks(subprocess_env, "llama", bf16, w12, 1,
                                 {"enable_fp32_lm_head": True})
    assert code != 0 and "--enable-fp32-lm-head" in err and "lm_head" in err, err[-2000:]


def test_dummy_load_format_serves_random_w12_weights(tmp_path, subprocess_env):
    """``--load-format dummy`` (speed runs without reading weights): the W12 layers get random
    planes instead of refusing their unread checkpoint, at TP 2, and the logits are finite."""
    bf16, w12 = write_folders(tmp_path, "qwen3")
    for code, out, err in run_ranks(subprocess_env, "qwen3", bf16, w12, 2,
                                    {"load_format": "dummy"}):
        assert code == 0, err[-3000:]
        report = json.loads(out.strip().splitlines()[-1])
        assert report["loader"] == "DummyModelLoader" and report["finite"], report
        assert report["methods"]["w12"] == "W12LinearMethod"
