"""W12 weights in the engine: folder, load-time encoding and synthetic builds equal BF16.

On the CPU ``w12_linear`` decodes the exact weights and calls the same torch GEMM, so W12 and
BF16 logits must agree bit for bit; the tests compare int32 views of the fp32 logits.
"""

from __future__ import annotations

import pytest
import torch

from converters.hf import ConvertOptions, convert_folder
from engine.generate import Engine, generate
from engine.w12_backend import cat_rows
from engine.weights import load_model
from w12 import encode

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 20, 30, 40]]


def logits_of(model, tokens: torch.Tensor) -> torch.Tensor:
    return model.score(tokens)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


TOKENS = torch.randint(0, 160, (2, 24), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("kind,options", [
    ("qwen2", ConvertOptions()),
    ("qwen3", ConvertOptions(lm_head=True)),
    ("llama-tied", ConvertOptions(embeddings=True)),
])
def test_w12_folder_equals_bf16_folder(tiny_folder, tmp_path, kind, options):
    src = tiny_folder(kind, dtype=torch.bfloat16)
    dst = tmp_path / "w12"
    convert_folder(src=src, dst=dst, options=options, progress=False)
    bf16 = load_model(src)
    w12 = load_model(dst)
    assert (bf16.mode, w12.mode) == ("bf16", "w12")
    assert any(layer.attn.wqkv.is_w12 for layer in w12.model.layers)
    expected = logits_of(bf16.model, TOKENS)
    assert same_bits(logits_of(w12.model, TOKENS), expected)
    # the W12 folder run with its weights decoded to BF16 at load
    assert same_bits(logits_of(load_model(dst, mode="bf16").model, TOKENS), expected)
    engine_a, engine_b = (Engine(m.model, batch=3, max_seq_len=32) for m in (bf16, w12))
    assert generate(engine_a, PROMPTS, max_new_tokens=8) == generate(
        engine_b, PROMPTS, max_new_tokens=8)


def test_encoding_at_load_equals_bf16(tiny_folder):
    src = tiny_folder("llama", dtype=torch.bfloat16)
    bf16, w12 = load_model(src, mode="bf16"), load_model(src, mode="w12")
    assert w12.model.lm_head.is_w12 and w12.model.layers[1].w2.is_w12
    assert same_bits(logits_of(w12.model, TOKENS), logits_of(bf16.model, TOKENS))


def test_synthetic_builds_share_weights_across_modes():
    bf16 = load_model("synthetic:tiny-qwen3", mode="bf16", seed=5)
    w12 = load_model("synthetic:tiny-qwen3", mode="w12", seed=5)
    other = load_model("synthetic:tiny-qwen3", mode="bf16", seed=6)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    expected = logits_of(bf16.model, tokens)
    assert same_bits(logits_of(w12.model, tokens), expected)
    assert not torch.equal(logits_of(other.model, tokens), expected)
    assert w12.weight_bytes != bf16.weight_bytes
    assert torch.isfinite(expected).all()


def test_cat_rows_stacks_planes_and_escapes():
    gen = torch.Generator().manual_seed(0)
    parts = [(torch.randn(n, 37, generator=gen) * 0.1).to(torch.bfloat16) for n in (5, 3, 4)]
    bits = parts[1].view(torch.int16)
    bits[0, :5] = torch.tensor([0, -32768, 0x7F80, 0x7FC1, 1], dtype=torch.int16)  # escapes
    parts[2][2, 7] = 0.0
    stacked = cat_rows([encode(p) for p in parts])
    stacked.validate("stacked")
    assert torch.equal(stacked.decode().view(torch.int16), torch.cat(parts).view(torch.int16))
