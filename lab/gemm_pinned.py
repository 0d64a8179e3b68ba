"""benchmarks/gemm.py with the large-M path pinned as lab/determinism.py --large pins it,
and lab/determinism.py's kernel patches (``--patch NAME`` before the benchmark's options).

    python lab/gemm_pinned.py nopersist --shapes 3072x576 --m 1240,2048
    python lab/gemm_pinned.py table --patch noproxyfence --models qwen3_8b --m 256,1024
"""

import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path[:0] = [str(here), str(here.parent), str(here.parent / "benchmarks")]
import determinism  # noqa: E402

determinism._pin_large(sys.argv[1])
rest, patches = sys.argv[2:], []
while rest[:1] == ["--patch"]:
    patches.append(rest[1])
    rest = rest[2:]
determinism._patch_kernel(patches)
sys.argv = ["benchmarks/gemm.py", *rest]
runpy.run_path(str(here.parent / "benchmarks" / "gemm.py"), run_name="__main__")
