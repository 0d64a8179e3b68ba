"""Reading JSON files that users hand us (config.json, shard indexes) with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from w12.errors import W12Error


def read_json(path: Path) -> object:
    """The parsed file; unreadable or invalid JSON is a ``W12Error`` naming the file."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise W12Error(f"{path}: not valid JSON ({' '.join(str(exc).split())})") from exc


def read_json_object(path: Path, *, required: bool) -> dict | None:
    """A JSON object file; a missing file is an error when ``required``, else None."""
    path = Path(path)
    if not path.is_file():
        if required:
            raise W12Error(f"{path}: missing (a model folder needs it)")
        return None
    value = read_json(path)
    if not isinstance(value, dict):
        raise W12Error(f"{path}: expected a JSON object")
    return value
