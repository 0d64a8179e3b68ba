"""The ``sglang.srt.plugins`` entry point: put ``w12`` into SGLang's quantization registry.

SGLang (0.5.11 and later) calls every function registered under that entry-point group early in
each process it starts (server, scheduler workers), before it parses arguments or builds a
model. ``register`` is idempotent, so it may run again from ``w12 serve``.
"""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version

from w12.errors import W12Error

SGLANG_VERSION = "0.5.21"  # the release the plugin is built and tested against


def check_version(found: str) -> None:
    """Refuse SGLang releases other than the one the plugin is built for (post releases pass):
    the layer and loader internals it relies on change between releases."""
    if Version(found).release != Version(SGLANG_VERSION).release:
        raise W12Error(f"W12's SGLang plugin needs SGLang {SGLANG_VERSION}, found {found} "
                       f"(pip install 'w12[sglang]')")


def register() -> None:
    """Add W12 to SGLang's quantization methods and ``--quantization`` choices."""
    check_version(version("sglang"))
    from sglang.srt.layers import quantization
    from sglang.srt.server_args import QUANTIZATION_CHOICES, add_quantization_method_choices

    from sglang_integration.method import NAME, W12Config

    quantization.QUANTIZATION_METHODS[NAME] = W12Config
    if NAME not in QUANTIZATION_CHOICES:
        add_quantization_method_choices([NAME])
