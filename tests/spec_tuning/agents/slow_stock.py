"""A scripted agent for the tests: the no-op option of ``noop_option.py``, plus a sleep in
every serving step while the option is off, so that turning it on looks like a gain when both
sides run the patched code (what the stock-path check must catch)."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).with_name("noop_option.py")))
serving = Path("engine/serving.py")
text = serving.read_text()
old = "        self.admission = admission\n"
assert old in text
text = text.replace(old, old + "        self.test_noop = test_noop\n", 1)
old = "    def _decode_step(self) -> list[list[int]]:\n"
assert old in text
text = text.replace(old, old + "        if not self.test_noop:\n            time.sleep(0.02)\n", 1)
old = "    def _spec_step(self, stats: ServeStats) -> list[list[int]]:\n"
assert old in text
text = text.replace(old, old + "        if not self.test_noop:\n            time.sleep(0.02)\n", 1)
serving.write_text(text)
print("slowed the stock path")
