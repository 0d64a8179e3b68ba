"""All-or-nothing output folders.

Every converter writes into a temporary folder next to the destination (same file system, so the
final ``rename`` is atomic) and renames it into place only when everything succeeded. On any error,
including ``KeyboardInterrupt``, the temporary folder is removed, so a half-written destination
never exists. An existing destination is replaced only with ``force=True``, and never when it is,
contains, or lies inside the source.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from w12.errors import W12Error


def check_destination(dst: Path, *, force: bool, sources: tuple[Path, ...] = ()) -> None:
    """Refuse an existing destination (unless ``force``) or one overlapping a source."""
    dst_abs = Path(dst).absolute().resolve()
    for src in sources:
        src_abs = Path(src).absolute().resolve()
        if dst_abs == src_abs or src_abs in dst_abs.parents or dst_abs in src_abs.parents:
            raise W12Error(f"{dst}: destination overlaps the source {src}; pick another folder")
    if dst.exists() or dst.is_symlink():
        if not force:
            raise W12Error(f"{dst}: already exists (pass --force to replace it)")
        if not dst.is_dir():
            raise W12Error(f"{dst}: exists and is not a folder; refusing to replace it")


@contextlib.contextmanager
def output_folder(dst: Path, *, force: bool, sources: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Yield a fresh temporary folder that becomes ``dst`` when the block exits without error."""
    dst = Path(dst)
    check_destination(dst, force=force, sources=sources)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent))
    try:
        yield tmp
        _move_into_place(tmp, dst, force=force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def apply_umask(folder: Path) -> None:
    """Give the output the modes of a normally created folder (mkdtemp makes it private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _move_into_place(tmp: Path, dst: Path, *, force: bool) -> None:
    # check again: the destination may have appeared while we were writing
    check_destination(dst, force=force)
    apply_umask(tmp)
    if not dst.exists():
        tmp.rename(dst)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".old", dir=dst.parent))
    old.rmdir()
    dst.rename(old)
    try:
        tmp.rename(dst)
    except BaseException:
        old.rename(dst)
        raise
    shutil.rmtree(old, ignore_errors=True)
