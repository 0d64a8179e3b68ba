"""GGUF -> BF16 HF folder: names, shapes, the rotary row permutation, values, config, tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_fixtures import assert_bits_equal

from converters.gguf import (
    gguf_to_hf,
    hf_tensor_name,
    permute_rotary_rows,
    unpermute_rotary_rows,
)
from converters.source import HFCheckpoint
from w12.errors import W12Error

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 96, 2
HEAD_DIM = HIDDEN // HEADS
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "4 2"]


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table (printable bytes map to themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _vocab() -> tuple[list[str], list[int]]:
    merged = ["".join(m.split()) for m in MERGES]
    tokens = SPECIAL + _byte_alphabet() + merged
    types = [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))
    return tokens, types


def _q8_0_dequant(raw: np.ndarray) -> np.ndarray:
    """Independent Q8_0 decoder: per 32 weights, an fp16 scale then 32 int8 values."""
    blocks = raw.reshape(raw.shape[0], -1, 34)
    scale = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    values = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
    return (scale * values).reshape(raw.shape[0], -1)


def _weights(tied: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    vocab = len(_vocab()[0])

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w = {"token_embd.weight": rand(vocab, HIDDEN), "output_norm.weight": 1 + rand(HIDDEN)}
    for i in range(LAYERS):
        w[f"blk.{i}.attn_q.weight"] = rand(HIDDEN, HIDDEN)
        w[f"blk.{i}.attn_k.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[f"blk.{i}.attn_v.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[f"blk.{i}.attn_output.weight"] = rand(HIDDEN, HIDDEN)
        w[f"blk.{i}.ffn_gate.weight"] = rand(FFN, HIDDEN)
        w[f"blk.{i}.ffn_up.weight"] = rand(FFN, HIDDEN)
        w[f"blk.{i}.ffn_down.weight"] = rand(HIDDEN, FFN)
        w[f"blk.{i}.attn_norm.weight"] = 1 + rand(HIDDEN)
        w[f"blk.{i}.ffn_norm.weight"] = 1 + rand(HIDDEN)
    if not tied:
        w["output.weight"] = rand(vocab, HIDDEN)
    return w


# storage type per llama.cpp tensor kind: float32, float16 and Q8_0 all appear
_STORAGE = {"attn_q": Q.F32, "attn_k": Q.Q8_0, "attn_v": Q.F16, "attn_output": Q.Q8_0,
            "ffn_gate": Q.Q8_0, "ffn_up": Q.F16, "ffn_down": Q.Q8_0, "token_embd": Q.F16,
            "output": Q.Q8_0}


def _storage(name: str):
    part = name.split(".")[-2]
    return _STORAGE.get(part, Q.F32)


def _stored_and_expected(name: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the GGUF file holds for ``w`` (permuted like llama.cpp), and the float32 expected."""
    part = name.split(".")[-2]
    heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(part)
    stored = permute_rotary_rows(w, heads) if heads else w
    kind = _storage(name)
    if kind == Q.F32:
        data, back = stored, stored
    elif kind == Q.F16:
        data = stored.astype(np.float16)
        back = data.astype(np.float32)
    else:
        data = gguf.quants.quantize(stored, kind)
        back = _q8_0_dequant(data)
    return data, (unpermute_rotary_rows(back, heads) if heads else back)


def write_gguf(path: Path, *, tied: bool) -> dict[str, np.ndarray]:
    """A small llama GGUF file; returns the float32 value each HF tensor should get."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(100000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens, types = _vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>"
                             "{% endfor %}")
    expected = {}
    for name, w in _weights(tied).items():
        data, back = _stored_and_expected(name, w)
        kind = _storage(name)
        writer.add_tensor(name, data, raw_dtype=kind if kind == Q.Q8_0 else None)
        expected[hf_tensor_name(name)] = back
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.mark.parametrize("heads,rows,cols", [(4, 64, 32), (2, 32, 1), (9, 576, 8), (3, 192, 5)])
def test_unpermute_inverts_llama_cpp_permutation(heads, rows, cols):
    rng = np.random.default_rng(heads * rows)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if cols == 1:
        w = w[:, 0]  # biases are permuted the same way
    permuted = permute_rotary_rows(w, heads)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(unpermute_rotary_rows(permuted, heads), w)
    assert np.array_equal(permute_rotary_rows(unpermute_rotary_rows(w, heads), heads), w)


def test_permutation_matches_rotary_pairing():
    """Row 2i of a permuted head holds HF row i and row 2i+1 holds HF row i + d/2."""
    d = 8
    w = np.arange(2 * d, dtype=np.float32).reshape(-1, 1)
    permuted = permute_rotary_rows(w, 2)[:, 0]
    assert permuted[:d].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert permuted[d:].tolist() == [8, 12, 9, 13, 10, 14, 11, 15]


def test_names():
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("blk.11.ffn_down.weight") == "model.layers.11.mlp.down_proj.weight"
    assert hf_tensor_name("blk.0.attn_norm.weight") == "model.layers.0.input_layernorm.weight"
    assert hf_tensor_name("blk.3.ffn_norm.weight") == \
        "model.layers.3.post_attention_layernorm.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(W12Error, match="rope_freqs.weight"):
        hf_tensor_name("rope_freqs.weight")


@pytest.mark.parametrize("tied", [True, False])
def test_small_gguf_to_hf(tmp_path: Path, tied: bool):
    src = tmp_path / "tiny.gguf"
    expected = write_gguf(src, tied=tied)
    dst = gguf_to_hf(src=src, dst=tmp_path / "hf", progress=False)
    checkpoint = HFCheckpoint(dst)
    assert sorted(checkpoint.names()) == sorted(expected)
    for name, values in expected.items():
        tensor = checkpoint.read(name)
        assert tensor.dtype == torch.bfloat16 and tuple(tensor.shape) == values.shape
        assert_bits_equal(tensor, torch.from_numpy(values).to(torch.bfloat16))
    # the Q8_0 k_proj came back in HF row order: close to the weights before quantisation
    original = _weights(tied)["blk.0.attn_k.weight"]
    k_proj = checkpoint.read("model.layers.0.self_attn.k_proj.weight").float().numpy()
    assert np.abs(k_proj - original).max() < 0.01
    config = json.loads((dst / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["intermediate_size"]) == (HIDDEN, FFN)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (HEADS, KV_HEADS)
    assert config["num_hidden_layers"] == LAYERS and config["vocab_size"] == len(_vocab()[0])
    assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 100000.0
    assert config["tie_word_embeddings"] is tied and config["torch_dtype"] == "bfloat16"
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    source = config["w12_source"]
    assert source["format"] == "gguf" and source["file_type"] == "MOSTLY_Q8_0"
    assert source["dequantized_to"] == "bfloat16" and set(source["tensor_types"]) == {
        "F32", "F16", "Q8_0"}


def test_tokenizer_files(tmp_path: Path):
    src = tmp_path / "tiny.gguf"
    write_gguf(src, tied=True)
    dst = gguf_to_hf(src=src, dst=tmp_path / "hf", progress=False)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<|im_start|>" and config["eos_token"] == "<|im_end|>"
    assert config["chat_template"].startswith("{% for m in messages %}")
    document = json.loads((dst / "tokenizer.json").read_text())
    assert document["model"]["merges"] == MERGES
    assert [t["content"] for t in document["added_tokens"] if t["special"]] == SPECIAL
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(dst / "tokenizer.json"))
    text = "hello world 42<|im_end|>"
    encoding = tok.encode(text)
    # smollm splits digits one by one, so the "4 2" merge never applies
    assert encoding.tokens == ["hello", "Ġw", "o", "r", "l", "d", "Ġ", "4", "2", "<|im_end|>"]
    assert tok.decode(encoding.ids, skip_special_tokens=False) == text


def test_not_a_gguf_file(tmp_path: Path):
    src = tmp_path / "bad.gguf"
    src.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(W12Error, match="bad.gguf: not a readable GGUF file"):
        gguf_to_hf(src=src, dst=tmp_path / "hf", progress=False)
    assert not (tmp_path / "hf").exists()
