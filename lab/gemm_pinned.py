"""benchmarks/gemm.py with the large-M path pinned as lab/determinism.py --large pins it.

    python lab/gemm_pinned.py nopersist --shapes 3072x576 --m 1240,2048
"""

import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path[:0] = [str(here), str(here.parent), str(here.parent / "benchmarks")]
import determinism  # noqa: E402

determinism._pin_large(sys.argv[1])
sys.argv = ["benchmarks/gemm.py", *sys.argv[2:]]
runpy.run_path(str(here.parent / "benchmarks" / "gemm.py"), run_name="__main__")
