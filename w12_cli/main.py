"""The ``w12`` group: every command, each loaded from its module only when it is named.

Usage errors exit with 2 (click); user errors raised by a command are one ``error: ...`` line
and exit code 2 (``options.Group``); ``verify`` exits with 1 when the folders differ. Warnings
logged by the packages go to stderr as ``warning: ...`` lines.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

import w12
from w12_cli.options import Group

# command -> (module, attribute)
COMMANDS = {
    "convert": ("w12_cli.format", "convert"),
    "verify": ("w12_cli.format", "verify"),
    "inspect": ("w12_cli.format", "inspect"),
    "decode": ("w12_cli.format", "decode"),
    "demo": ("w12_cli.format", "demo"),
    "generate": ("w12_cli.generate", "generate_command"),
    "bench": ("w12_cli.bench", "bench_group"),
    "tune": ("w12_cli.tune", "tune_group"),
    "serve": ("w12_cli.serve", "serve_command"),
    "spec": ("w12_cli.spec", "spec_group"),
    "draft": ("w12_cli.draft", "draft_group"),
}


class _LazyGroup(Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, attribute = COMMANDS[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise click.ClickException(f"'{name}' needs {exc.name}, which is missing") from exc
        return getattr(module, attribute)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(w12.__version__, prog_name="w12")
def main() -> None:
    """W12: lossless 12-bit storage for BF16 weights."""
    logging.basicConfig(format="warning: %(message)s", level=logging.WARNING, stream=sys.stderr)
