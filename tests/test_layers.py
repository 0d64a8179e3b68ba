"""Imports point one way: the import-linter contracts of ``pyproject.toml``, run on the tree.

The contracts: the command line (``w12_cli``) on top, then ``spec_tuning``, then ``engine`` and
``sglang_integration``, then ``converters`` and ``w12_kernels``, with ``w12`` (the format) at
the bottom; siblings on one layer do not import each other, and the engine reaches the kernels
only through ``engine.w12_backend``. The same contracts, run on a small tree of empty packages
with one wrong arrow planted, must fail and name it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("w12_cli", "spec_tuning", "engine", "sglang_integration", "converters",
            "w12_kernels", "w12")
# what engine.w12_backend may import (the kernel families and the CPU linear)
KERNEL_FAMILIES = ("cpu_linear", "gated_delta", "gemm", "int8_head", "norm", "tree_attention",
                   "view8")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages below ``cwd`` with the contracts of its pyproject.toml
    (its own process: import-linter puts ``cwd`` first on ``sys.path``)."""
    command = [sys.executable, "-c", "import sys; from importlinter.cli import "
               "lint_imports_command; sys.exit(lint_imports_command())", "--no-cache",
               "--no-logo", "pyproject.toml"]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _fixture_tree(root: Path) -> None:
    """Empty packages with the project's names and its pyproject.toml; the imports the
    engine-door contract allows, so that its ``ignore_imports`` entries match."""
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for package in PACKAGES:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
    for family in KERNEL_FAMILIES:
        (root / "w12_kernels" / family).mkdir()
        (root / "w12_kernels" / family / "__init__.py").write_text("")
    (root / "engine" / "w12_backend.py").write_text(
        "".join(f"import w12_kernels.{family}\n" for family in KERNEL_FAMILIES))


def test_the_fixture_tree_keeps_every_contract(tmp_path):
    _fixture_tree(tmp_path)
    result = lint_imports(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


WRONG_ARROWS = [
    ("w12", "converters", "w12 is not allowed to import converters"),
    ("converters", "w12_kernels", "converters is not allowed to import w12_kernels"),
    ("w12_kernels", "engine", "w12_kernels is not allowed to import engine"),
    ("engine", "sglang_integration", "engine is not allowed to import sglang_integration"),
    ("sglang_integration", "engine", "sglang_integration is not allowed to import engine"),
    ("spec_tuning", "w12_cli", "spec_tuning is not allowed to import w12_cli"),
    ("engine.generate", "w12_kernels.gemm", "engine.generate -> w12_kernels.gemm"),
]


@pytest.mark.parametrize(("importer", "imported", "report"), WRONG_ARROWS,
                         ids=[f"{a}->{b}" for a, b, _ in WRONG_ARROWS])
def test_a_wrong_arrow_breaks_a_contract(tmp_path, importer, imported, report):
    _fixture_tree(tmp_path)
    package, _, module = importer.partition(".")
    path = tmp_path / package / f"{module or '__init__'}.py"
    path.write_text(f"import {imported}\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout and report in result.stdout, result.stdout
