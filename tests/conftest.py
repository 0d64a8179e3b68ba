"""Test-suite root: being here puts ``tests/`` on the import path, so test modules of every
folder can use the shared helpers next to this file (``interp_harness.py``)."""
