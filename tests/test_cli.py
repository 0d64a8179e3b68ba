"""The ``w12`` CLI through click's test runner: exit codes 0/1/2, one-line errors, JSON output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from w12_cli import main
from w12_cli.format import parse_size


def _source(folder: Path, *, dtype=torch.bfloat16, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        "model.embed_tokens.weight": torch.randn(40, 24, generator=gen).to(dtype),
        "model.layers.0.mlp.up_proj.weight": torch.randn(36, 24, generator=gen).to(dtype),
        "model.layers.0.mlp.down_proj.weight": torch.randn(24, 36, generator=gen).to(dtype),
        "model.layers.0.input_layernorm.weight": torch.ones(24, dtype=dtype),
    }
    tensors["model.layers.0.mlp.up_proj.weight"][0, :3] = torch.tensor([0.0, float("inf"), 1e-40])
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return tensors


def _run(*args: str) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error_line(result, *needles: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def converted(tmp_path: Path) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    tensors = _source(tmp_path / "src")
    result = _run("convert", "-q", tmp_path / "src", tmp_path / "w12")
    assert result.exit_code == 0, result.output
    assert "converted 2 of 4 tensors" in result.stdout
    return tmp_path / "src", tmp_path / "w12", tensors


def test_verify_ok(converted):
    src, dst, _ = converted
    result = _run("verify", "-q", src, dst)
    assert result.exit_code == 0 and result.stdout.startswith("OK: all 4 tensors bit-identical")


def test_verify_reports_a_flipped_bit(converted, tmp_path: Path):
    src, dst, tensors = converted
    changed = tmp_path / "changed"
    shutil.copytree(src, changed)
    tensors["model.layers.0.mlp.down_proj.weight"].view(torch.int16)[5, 7] ^= 1
    save_file(tensors, str(changed / "model.safetensors"), metadata={"format": "pt"})
    result = _run("verify", "-q", changed, dst)
    assert result.exit_code == 1
    assert "DIFFERENT model.layers.0.mlp.down_proj.weight: 1 element(s) differ, first at " \
           "index (5, 7)" in result.stderr


def test_verify_reports_missing_and_extra_tensors(converted, tmp_path: Path):
    src, dst, tensors = converted
    other = tmp_path / "other"
    shutil.copytree(src, other)
    tensors["model.layers.0.extra.weight"] = tensors.pop("model.layers.0.input_layernorm.weight")
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    result = _run("verify", "-q", other, dst)
    assert result.exit_code == 1
    assert "model.layers.0.extra.weight: missing from" in result.stderr
    assert "model.layers.0.input_layernorm.weight: in " in result.stderr


def test_inspect_json_and_text(converted):
    _, dst, tensors = converted
    result = _run("inspect", dst, "--json")
    assert result.exit_code == 0
    stats = json.loads(result.stdout)
    w12_rows = sum(t.shape[0] for n, t in tensors.items() if "mlp" in n)
    assert stats["w12_tensors"] == 2 and sum(stats["e0_histogram"].values()) == w12_rows
    assert sum(stats["eoff_histogram"]) + stats["escapes"] == stats["w12_elements"]
    assert stats["escapes"] >= 2  # the zero and the infinity planted in up_proj
    assert stats["bits_per_weight"] == pytest.approx(8 * stats["stored_bytes"] / stats["elements"])
    text = _run("inspect", dst)
    assert text.exit_code == 0 and "bits/weight:" in text.stdout and "#" in text.stdout


def test_decode_round_trip_and_force(converted, tmp_path: Path):
    _, dst, tensors = converted
    out = tmp_path / "decoded"
    assert _run("decode", "-q", dst, out).exit_code == 0
    decoded = load_file(str(out / "model.safetensors"))
    assert sorted(decoded) == sorted(tensors)
    for name, tensor in tensors.items():
        assert torch.equal(decoded[name].view(torch.int16), tensor.view(torch.int16))
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    _one_error_line(_run("decode", "-q", dst, out), "already exists", "--force")
    assert _run("decode", "-q", "--force", dst, out).exit_code == 0


def test_convert_errors_are_one_line(converted, tmp_path: Path):
    src, dst, _ = converted
    _one_error_line(_run("convert", "-q", src, dst), str(dst), "already exists")
    _one_error_line(_run("convert", "-q", tmp_path / "nowhere", tmp_path / "x"), "nowhere")
    _one_error_line(_run("inspect", src), "model.safetensors")
    _one_error_line(_run("convert", "-q", dst, tmp_path / "twice"), "already a W12 folder")
    _one_error_line(_run("verify", "-q", src, tmp_path / "nowhere"), "nowhere")
    fp32 = tmp_path / "fp32"
    _source(fp32, dtype=torch.float32)
    _one_error_line(_run("convert", "-q", fp32, tmp_path / "y"), "is float32", "--cast-to-bf16")
    assert _run("convert", "-q", "--cast-to-bf16", fp32, tmp_path / "y").exit_code == 0
    assert _run("verify", "-q", fp32, tmp_path / "y").exit_code == 0


def test_usage_errors_exit_2(tmp_path: Path):
    assert _run("convert", "--max-shard-size", "lots", tmp_path, tmp_path / "x").exit_code == 2
    assert _run("convert", tmp_path).exit_code == 2
    assert _run("frobnicate").exit_code == 2


def test_parse_size():
    assert parse_size("2GB") == 2 * 10**9 and parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5 gb") == 1_500_000_000 and parse_size("1000") == 1000



def test_help_lists_every_command_without_loading_the_packages():
    """``w12 --help`` imports each command's module, but no package above ``w12``: they load
    when a command runs."""
    code = ("import sys\nfrom w12_cli import main\ntry:\n    main(['--help'], prog_name='w12')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('engine', 'spec_tuning',"
            " 'converters', 'w12_kernels', 'sglang_integration', 'sglang')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    commands = ("bench", "convert", "decode", "demo", "generate", "inspect", "serve", "tune",
                "verify")
    assert all(f"\n  {name} " in result.stdout for name in commands), result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"
