"""``lab/sglang_decode.py`` (the decode-step timing inside SGLang's model class that a GPU run
uses) runs on the CPU at TP 2: one process a rank, SGLang's own process groups over gloo, the
W12 and BF16 models each through a decode step at two batch sizes with finite logits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "sglang_decode.py"


def test_decode_steps_at_tp2_on_the_cpu(subprocess_env):
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--preset",
                           "tiny-qwen3", "--batch", "1,3", "--context", "16", "--tp", "2"],
                          env=subprocess_env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    lines = done.stdout.splitlines()
    assert any("TP 2" in line for line in lines), done.stdout[-2000:]
    for batch in (1, 3):
        assert any(line.startswith(f"batch {batch:>3}: both steps ran, logits finite ({batch}, ")
                   for line in lines), done.stdout[-2000:]
