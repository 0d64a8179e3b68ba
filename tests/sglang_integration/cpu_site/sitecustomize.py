"""Started by Python in test subprocesses that put this folder on PYTHONPATH."""

import sglang_cpu_stubs

sglang_cpu_stubs.install()
