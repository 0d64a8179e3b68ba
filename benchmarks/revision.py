"""The small-M kernel's sources at a git revision of this repository, or in a directory that
holds a revision's ``kernels.cu`` and ``cuda.py`` (for a machine whose checkout has no history):
what ``gemm_ab.py`` and ``kernel_regs.py`` compare the working tree with.

    python benchmarks/revision.py HEAD saved/   # saved/kernels.cu and saved/cuda.py of HEAD
    python benchmarks/gemm_ab.py --baseline saved/   # on the GPU machine, after a change
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = "w12_kernels/gemm/kernels.cu"
CUDA_PY = "w12_kernels/gemm/cuda.py"


def source_at(rev: str, path: str, tool: str) -> str:
    """The text of ``path`` at git revision ``rev``, or, where ``rev`` is a directory, of the
    file of that name in it; ``SystemExit`` naming ``tool`` where there is none."""
    folder = Path(rev)
    if folder.is_dir():
        source = folder / Path(path).name
        if not source.is_file():
            raise SystemExit(f"{tool}: {rev} has no {Path(path).name}")
        return source.read_text()
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tool}: cannot read {path} at {rev!r}: "
                         f"{done.stderr.strip() or 'git failed'}")
    return done.stdout


def cuda_module(rev: str, name: str, tool: str) -> types.ModuleType:
    """``cuda.py`` at ``rev`` run as a module of its own, named ``name`` (its own compile and
    launch caches; it compiles the tree's ``kernels.cu`` unless its ``SOURCE_PATH`` is set)."""
    module = types.ModuleType(name)
    module.__file__ = str(ROOT / CUDA_PY)
    exec(compile(source_at(rev, CUDA_PY, tool), f"{rev}:{CUDA_PY}", "exec"), module.__dict__)
    return module


def save(rev: str, folder: Path) -> list[Path]:
    """Write ``kernels.cu`` and ``cuda.py`` of ``rev`` into ``folder`` (created); their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for path in (KERNELS, CUDA_PY):
        target = folder / Path(path).name
        target.write_text(source_at(rev, path, "revision"))
        out.append(target)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description="Save a revision's small-M kernel sources "
                                                 "(kernels.cu, cuda.py) into a directory.")
    parser.add_argument("rev", help="git revision (or a directory holding the two files)")
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    for path in save(args.rev, args.folder):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
