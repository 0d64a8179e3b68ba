"""The installed package (not only an editable checkout) carries every file its modules read."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_package_data_covers_every_non_python_file_of_the_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    patterns = setuptools.get("package-data", {})
    packages = [p.rstrip("*") for p in setuptools["packages"]["find"]["include"]]
    missing = []
    for package in packages:
        base = ROOT / package
        for path in base.rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(base).as_posix()
            if not any(fnmatch.fnmatch(rel, pat) for pat in patterns.get(package, [])):
                missing.append(f"{package}/{rel}")
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_the_sglang_extra_brings_cupy_for_its_cuda():
    """``pip install "w12[sglang]"`` must bring the CuPy build of SGLang's CUDA (13 for
    0.5.21), or the W12 GEMM under SGLang runs its slower Triton kernels."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = project["project"]["optional-dependencies"]["sglang"]
    assert "sglang==0.5.21" in extra
    assert any(req.startswith("cupy-cuda13x") for req in extra), extra
