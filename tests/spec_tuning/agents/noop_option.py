"""A scripted agent for the tests: adds a server argument that changes nothing and registers
it as an option (a mechanism in form only: the judges must still judge it)."""

import json
import os
from pathlib import Path

brief = json.loads(Path(os.environ["W12_TUNE_BRIEF"]).read_text())
assert brief["factor"] in brief["factors"] and "contract" in brief
registry = Path("spec_tuning/registry.py")
text = registry.read_text()
entry = ('    Mechanism("test_noop", (0, 1), 0, "acceptance", "engine.serving.Server:test_noop",'
         ' 1.0,\n              help="a test fixture: a server argument that changes nothing"),\n')
registry.write_text(text.replace("\n)}\n", "\n" + entry + ")}\n", 1))
serving = Path("engine/serving.py")
old = "two_level: TwoLevel | None = None) -> None:"  # the last argument of Server
assert old in serving.read_text()
serving.write_text(serving.read_text().replace(
    old, "two_level: TwoLevel | None = None, test_noop: int = 0) -> None:", 1))
print("added test_noop")
