"""Turning a ``SRC`` argument into a local path: a folder, a ``.gguf`` file, or a hub id.

A path that exists is used as it is. A string that does not exist locally but looks like a hub
repository id (``owner/name``) is fetched with ``huggingface_hub.snapshot_download``, which uses
its cache and honours ``HF_HUB_OFFLINE``; only the files a conversion needs (safetensors weights,
JSON configs, tokenizer files, templates) are requested. Any failure (offline and not cached,
no network, unknown or gated repository) becomes one ``W12Error`` line.
"""

from __future__ import annotations

import re
from pathlib import Path

from w12.errors import W12Error

HUB_PATTERNS = ["*.safetensors", "*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def looks_like_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text)) and ".." not in text


def resolve_source(src: str | Path) -> Path:
    """A local folder or file for ``src``, downloading (or finding in the hub cache) a hub id."""
    path = Path(src)
    if path.exists():
        return path
    text = str(src)
    if not looks_like_hub_id(text):
        raise W12Error(f"{text}: no such file or folder (and not a hub id like owner/name)")
    return Path(_snapshot(text))


def _snapshot(repo_id: str) -> str:
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError as exc:
        raise W12Error(f"{repo_id}: fetching hub ids needs the huggingface_hub package") from exc
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_PATTERNS)
    except Exception as exc:  # network, auth and cache errors all become one line for the user
        if constants.HF_HUB_OFFLINE:
            raise W12Error(f"{repo_id}: not in the local Hugging Face cache and HF_HUB_OFFLINE "
                           f"is set, so it cannot be downloaded") from exc
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise W12Error(f"{repo_id}: not in the local Hugging Face cache and cannot be "
                       f"downloaded ({type(exc).__name__}: {reason})") from exc
