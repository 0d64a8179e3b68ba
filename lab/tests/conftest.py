"""The lab's own tests (``python -m pytest lab/tests``): the tuning steps' table logic and the
comparison tools' CPU parts. The project's test suite does not run them (it does not import the
lab)."""

import sys
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]
for path in (LAB, LAB.parent, LAB.parent / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
