"""What the CLI calls: one typed function per command, whatever the kind of ``SRC``.

``SRC`` may be a Hugging Face folder, a GGUF file, or a hub id (``converters.hub``). A GGUF file
is first turned into a BF16 HF folder in a temporary folder next to the destination (removed
afterwards, also on error), and that folder is what gets converted or verified against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path

from converters.atomic import check_destination
from converters.hf import ConvertOptions, ConvertReport, convert_folder
from converters.hub import resolve_source
from converters.verify import VerifyReport, verify_folder
from w12.errors import W12Error

GGUF_MAGIC = b"GGUF"


def convert(*, src: str | Path, dst: Path, options: ConvertOptions | None = None,
            progress: bool = True) -> ConvertReport:
    """Convert a HF folder, GGUF file or hub id into the W12 folder ``dst``."""
    options = options or ConvertOptions()
    dst = Path(dst)
    path = resolve_source(src)
    check_destination(dst, force=options.force, sources=(path,))
    with hf_folder_of(path, scratch=dst.parent, progress=progress) as folder:
        report = convert_folder(src=folder, dst=dst, options=options, progress=progress)
    return dataclasses.replace(report, src=path)


def verify(*, src: str | Path, dst: Path, progress: bool = True) -> VerifyReport:
    """Check the W12 folder ``dst`` bit for bit against a HF folder, GGUF file or hub id."""
    path = resolve_source(src)
    with hf_folder_of(path, scratch=None, progress=progress) as folder:
        return verify_folder(src=folder, dst=Path(dst), progress=progress)


@contextlib.contextmanager
def hf_folder_of(path: Path, *, scratch: Path | None, progress: bool) -> Iterator[Path]:
    """``path`` itself for a folder; for a GGUF file, a temporary BF16 HF folder made from it."""
    if path.is_dir():
        yield path
        return
    if not is_gguf(path):
        raise W12Error(f"{path}: not a Hugging Face folder, a GGUF file or a hub id")
    from converters.gguf import gguf_to_hf

    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".w12-gguf-", dir=scratch) as tmp:
        yield gguf_to_hf(src=path, dst=Path(tmp) / "bf16", progress=progress)


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
