"""Fixtures for the converter tests: a small HF folder, and a session-wide W12 cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_fixtures import llama_tensors, write_hf_folder


@pytest.fixture
def llama_folder(tmp_path: Path) -> Path:
    return write_hf_folder(tmp_path / "src", llama_tensors())


@pytest.fixture(scope="session")
def w12_cache(tmp_path_factory) -> Path:
    """A fresh W12 cache for the session, so tests never depend on (or fill) the user's."""
    folder = tmp_path_factory.mktemp("w12-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("W12_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="session")
def demo_hf(w12_cache: Path) -> Path:
    from converters.demo_models import demo_hf_folder

    return demo_hf_folder(progress=False)
