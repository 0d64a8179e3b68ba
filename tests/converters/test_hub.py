"""Hub ids: offline without a cache fails in one line; a populated hub cache is used offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hf_fixtures import llama_tensors, write_hf_folder

from converters.hub import looks_like_hub_id
from w12.container import FolderReader

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _w12(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh process: huggingface_hub reads its variables at import."""
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "w12_cli", *args], capture_output=True,
                          text=True, env=full_env, timeout=300)


def test_hub_id_shape():
    assert looks_like_hub_id(REPO) and looks_like_hub_id("org/model.v2-1_0")
    for text in ("model", "a/b/c", "/abs/path", "../x", "./x", "a/..", "owner/"):
        assert not looks_like_hub_id(text), text


def test_offline_without_cache_is_one_line(tmp_path: Path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}
    result = _w12("convert", REPO, str(tmp_path / "dst"), env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: " + REPO), result.stderr
    assert "HF_HUB_OFFLINE" in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "dst").exists()


def test_hub_cache_is_used_offline(tmp_path: Path):
    """A snapshot laid out as huggingface_hub stores it: refs/main -> snapshots/<commit>."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = tmp_path / "hf" / "hub" / ("models--" + REPO.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    tensors = llama_tensors(seed=11)
    write_hf_folder(repo_dir / "snapshots" / commit, tensors)
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}
    result = _w12("convert", "-q", REPO, str(tmp_path / "dst"), env=env)
    assert result.returncode == 0, result.stderr
    assert sorted(FolderReader(tmp_path / "dst").names()) == sorted(tensors)
    result = _w12("verify", "-q", REPO, str(tmp_path / "dst"), env=env)
    assert result.returncode == 0 and result.stdout.startswith("OK: all"), result.stderr
