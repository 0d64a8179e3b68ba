"""``w12 serve``: run ``sglang serve`` (or ``bench_one_batch``) with W12 registered.

SGLang loads plugins in its server and its scheduler workers, but not in every entry point
(``bench_one_batch`` loads none, in the parent or in its per-GPU workers), and releases before
0.5.11 load none at all. So this replaces the current process with
``python -m sglang_integration.launch ENTRY ARGS...``, which registers W12 in it and in every
worker it spawns, then calls SGLang's own command-line function with ``ARGS`` untouched.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from w12.errors import W12Error

# entry -> (SGLang module, its command-line function, leading arguments)
ENTRIES = {
    "serve": ("sglang.cli.main", "main", ("serve",)),
    "bench_one_batch": ("sglang.benchmark.one_batch", "cli_main", ()),
}


def serve(*, sglang_args: Sequence[str], entry: str = "serve") -> NoReturn:
    """Run SGLang's ``entry`` with ``sglang_args`` (SGLang's own flags) and W12 registered.

    Does not return: the process becomes SGLang's (its exit code is SGLang's).
    """
    if entry not in ENTRIES:
        raise W12Error(f"w12 serve: unknown SGLang entry {entry!r} (one of {', '.join(ENTRIES)})")
    if importlib.util.find_spec("sglang") is None:
        raise W12Error("w12 serve: SGLang is not installed (pip install 'w12[sglang]')")
    command = [sys.executable, "-m", "sglang_integration.launch", entry, *sglang_args]
    os.execv(sys.executable, command)
