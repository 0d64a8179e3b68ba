"""``python -m sglang_integration.launch ENTRY [ARGS...]``: register W12, run SGLang's ENTRY.

Importing this module registers W12, on purpose: SGLang starts its workers with the ``spawn``
method, which imports the parent's ``__main__`` module in each worker before it runs the
worker's function. With this module as ``__main__``, every worker of a server or of a multi-GPU
``bench_one_batch`` registers W12 before it builds its part of the model, whether or not that
SGLang entry loads plugins. SGLang's command-line function is imported and called (not run as
``__main__``), so the functions it hands to its workers stay picklable by module name.
"""

from __future__ import annotations

import importlib
import sys

from sglang_integration.plugin import register
from sglang_integration.serve import ENTRIES

register()


def main(argv: list[str]) -> None:
    entry, *args = argv
    module, function, leading = ENTRIES[entry]
    sys.argv = [module, *leading, *args]
    getattr(importlib.import_module(module), function)()


if __name__ == "__main__":
    main(sys.argv[1:])
