"""``w12 serve``: SGLang with W12 registered (``sglang_integration.serve.serve``)."""

from __future__ import annotations

import click

from w12_cli.options import Command


@click.command("serve", cls=Command,
               context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.option("--bench-one-batch", is_flag=True,
              help="Run SGLang's bench_one_batch instead of its server.")
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED)
def serve_command(bench_one_batch: bool, sglang_args: tuple[str, ...]) -> None:
    """Run SGLang 0.5.21 with the W12 quantization method registered; every other argument
    is SGLang's own (``w12 serve --help`` prints SGLang's help)."""
    from sglang_integration.serve import serve

    serve(entry="bench_one_batch" if bench_one_batch else "serve", sglang_args=list(sglang_args))
