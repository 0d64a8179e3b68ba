"""The CPU side of ``benchmarks/gemm_ab.py`` (the kernel A/B): reading a revision's sources,
loading its ``cuda.py`` as a module of its own that compiles that revision's ``kernels.cu``, and
the per-M summary."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
from gemm_helpers import benchmark_module

from w12_kernels.gemm import cuda

ROOT = Path(__file__).resolve().parents[2]


def _in_git() -> bool:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    return done.returncode == 0


needs_git = pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")


@needs_git
def test_baseline_module_is_the_revisions_code(tmp_path):
    ab = benchmark_module("gemm_ab")
    head = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{ab.KERNELS}"],
                          capture_output=True, text=True, check=True).stdout
    base = ab.baseline_module("HEAD", tmp_path)
    assert base is not cuda
    assert base.SOURCE_PATH.read_text() == head  # what the baseline compiles
    assert base._source() == head
    # its own functions and caches, the revision's shared-memory rule
    assert base.gemm_small is not cuda.gemm_small
    assert base.small_shared_bytes(2, 8, 0, 1, 0, 1) > 0


@needs_git
def test_a_revision_that_does_not_exist_is_one_clear_error(tmp_path):
    ab = benchmark_module("gemm_ab")
    with pytest.raises(SystemExit, match="cannot read w12_kernels/gemm/kernels.cu at"):
        ab.baseline_module("no-such-revision-xyz", tmp_path)


def test_geomeans_per_m():
    ab = benchmark_module("gemm_ab")
    rows = [dict(m=1, baseline_us=10.0, tree_us=8.0, cublas_us=12.0),
            dict(m=1, baseline_us=20.0, tree_us=25.0, cublas_us=20.0),
            dict(m=16, baseline_us=4.0, tree_us=4.0, cublas_us=6.0)]
    g = ab.geomeans(rows)
    assert math.isclose(g[1]["baseline"], math.sqrt(1.2 * 1.0))
    assert math.isclose(g[1]["tree"], math.sqrt(1.5 * 0.8))
    assert math.isclose(g[16]["baseline"], 1.5) and math.isclose(g[16]["tree"], 1.5)


def test_a_baseline_directory_is_read_instead_of_git(tmp_path):
    ab = benchmark_module("gemm_ab")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "kernels.cu").write_text("// saved kernels\n")
    (saved / "cuda.py").write_text((ROOT / "w12_kernels/gemm/cuda.py").read_text())
    base = ab.baseline_module(str(saved), tmp_path)
    assert base.SOURCE_PATH.read_text() == "// saved kernels\n"
    assert base.gemm_small is not cuda.gemm_small
    (saved / "cuda.py").unlink()
    with pytest.raises(SystemExit, match="has no cuda.py"):
        ab.baseline_module(str(saved), tmp_path)
