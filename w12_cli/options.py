"""What the command modules share: user errors as one line, and common options.

A ``W12Error`` (a file, tensor or value a user got wrong) or an ``OSError`` (a missing file, a
full disk) raised by a command is printed as one ``error: ...`` line on stderr with exit code 2,
as click does for usage errors, whichever group the command is attached to (``Command`` and
``Group`` below); never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import click

from w12.errors import W12Error


class _OneLineErrors:
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (W12Error, OSError) as exc:
            message = " ".join(str(exc).split()) or type(exc).__name__
            click.echo(f"error: {message}", err=True)
            ctx.exit(2)


class Command(_OneLineErrors, click.Command):
    """A command whose user errors end it with one ``error:`` line and exit code 2."""


class Group(_OneLineErrors, click.Group):
    """A group whose commands' user errors end them with one ``error:`` line and exit code 2."""


def positive_int_list(ctx, param, value: str | None) -> list[int] | None:
    """Click callback for options like ``--batch 1,8,32`` (None where the option has no
    default and is not given)."""
    if value is None:
        return None
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{value!r} is not a list of positive integers like 1,8,32")
    return sizes


def _default_device(ctx, param, device: str | None) -> str:
    """The device asked for, else the GPU when there is one."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def compile_default(compile_: bool | None, device: str) -> bool:
    """``--compile/--no-compile`` as given, else on for CUDA devices."""
    return device.startswith("cuda") if compile_ is None else compile_


device = click.option("--device", default=None, callback=_default_device,
                      help="cpu, cuda, cuda:1... (default: cuda if present).")
compile_ops = click.option("--compile/--no-compile", "compile_", default=None,
                           help="torch.compile the elementwise ops (default: on for CUDA).")
json_out = click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
                        help="Also write the results here.")
quiet = click.option("--quiet", "-q", is_flag=True, help="No progress bars.")


def _drafter_name(ctx, param, value: str | None) -> str | None:
    """``ngram``, ``early-exit:K``, ``random``, ``demo`` or a block drafter's folder, or one of
    the last four ``+ngram`` (the layer count and the drafter's fit are checked against the
    model later)."""
    if value is not None and value.endswith("+ngram") and value != "ngram+ngram":
        _drafter_name(ctx, param, value[:-len("+ngram")])
        return value
    if value is None or value in ("ngram", "random", "demo") or Path(value).is_dir():
        return value
    layers = value.partition(":")[2] if value.startswith("early-exit:") else ""
    if not layers.isdigit() or int(layers) < 1:
        raise click.BadParameter(f"{value!r}: a drafter is ngram, early-exit:K (K >= 1 layers), "
                                 "random, demo or the folder of a block drafter, or NAME+ngram")
    return value


drafter = click.option("--drafter", callback=_drafter_name, default=None,
                       help="Speculative decoding with this drafter: ngram (prompt lookup), "
                            "early-exit:K (the model's first K layers), random (full random "
                            "drafts, for timing with --forced-accept), demo (the block drafter "
                            "shipped for the demo model) or a block drafter's folder; "
                            "NAME+ngram grafts prompt lookup's continuation onto drafter "
                            "NAME's tree.")
budget = click.option("--budget", "--tree-budget", "budget", default=16, show_default=True,
                      type=click.IntRange(1, 128),
                      help="Nodes per verify step, the root included (a chain drafts budget - "
                           "1 tokens); at most 128, the rows the W12 GEMM keeps row-exact.")
weight_mode = click.option(
    "--bf16/--w12", "bf16", default=None,
    help="Linear layers in BF16 or W12 (default: W12 for a W12 folder, else BF16).")
two_level = click.option(
    "--two-level", "two_level", default=None, type=click.IntRange(1, 127),
    help="Two-level verification: a Q pass over a tree of this many nodes on the 8-bit view "
         "of the W12 weights steers what one exact pass over the step's budget verifies.")
int8_head = click.option(
    "--int8-head", "int8_head", is_flag=True,
    help="Pick tokens with the certified INT8 LM head: the exact head's tokens (greedy, or "
         "sampling without top-p) from an INT8 product and the exact rows of the few "
         "entries it cannot rule out; a W12 model on a GPU saves the bytes.")
tree_shape = click.option("--chain/--tree", "chain", default=False,
                          help="Verify the drafter's top-1 chain, or a best-first tree "
                               "(default).")
sampling_options = [
    click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0)),
    click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1)),
    click.option("--seed", default=0, show_default=True),
]


def sampling(command):
    """``--temperature``, ``--top-p`` and ``--seed`` on one command."""
    for option in reversed(sampling_options):
        command = option(command)
    return command
