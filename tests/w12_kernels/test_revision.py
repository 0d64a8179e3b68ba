"""``benchmarks/revision.py``: a revision's small-M kernel sources, from git or a directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gemm_helpers import benchmark_module

ROOT = Path(__file__).resolve().parents[2]


def _in_git() -> bool:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")
def test_save_writes_the_revisions_two_files_and_a_directory_reads_them_back(tmp_path):
    rev = benchmark_module("revision")
    saved = rev.save("HEAD", tmp_path / "saved")
    assert [p.name for p in saved] == ["kernels.cu", "cuda.py"]
    head = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{rev.KERNELS}"],
                          capture_output=True, text=True, check=True).stdout
    assert saved[0].read_text() == head
    assert rev.source_at(str(tmp_path / "saved"), rev.KERNELS, "t") == head
    module = rev.cuda_module(str(tmp_path / "saved"), "w12_test_saved_cuda", "t")
    assert module.small_shared_bytes(2, 8) > 0


def test_missing_sources_are_one_clear_error(tmp_path):
    rev = benchmark_module("revision")
    with pytest.raises(SystemExit, match="tool: .* has no kernels.cu"):
        rev.source_at(str(tmp_path), rev.KERNELS, "tool")
    if _in_git():
        with pytest.raises(SystemExit, match="tool: cannot read w12_kernels/gemm/cuda.py at"):
            rev.source_at("no-such-revision-xyz", rev.CUDA_PY, "tool")
