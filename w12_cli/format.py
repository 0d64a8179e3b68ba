"""The format commands: ``convert``, ``verify``, ``inspect``, ``decode`` and ``demo``.

Each calls one function of ``converters`` (``api.convert``, ``api.verify``,
``export.decode_folder``, ``demo_models.run_demo``) or ``w12.stats.inspect_folder``, imported
when the command runs, and prints its report; progress bars go to stderr (``--quiet`` turns
them off). ``verify`` (and ``demo``) exit with 1 when a tensor differs.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click

from w12_cli.options import Command, quiet

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6,
          "G": 10**9, "T": 10**12}


def parse_size(text: str) -> int:
    """Bytes in "2GB" (decimal, as Hugging Face counts), "512MiB" (binary) or "1000000"."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise click.BadParameter(f"{text!r} is not a size like 2GB, 500MB or 512MiB")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise click.BadParameter(f"{text!r} must be larger than 0")
    return size


max_shard_size = click.option("--max-shard-size", default="2GB", show_default=True,
                              callback=lambda ctx, param, value: parse_size(value),
                              help="Largest output shard (2GB, 500MB, 512MiB...).")


@click.command(cls=Command)
@click.argument("src")
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
@click.option("--embeddings", is_flag=True, help="Also convert the token/position embeddings.")
@click.option("--lm-head", is_flag=True, help="Also convert the LM head.")
@click.option("--cast-to-bf16", is_flag=True,
              help="Cast FP32/FP16 tensors to BF16 first (lossless relative to that cast).")
@click.option("--keep", multiple=True, metavar="PATTERN",
              help="Leave tensors whose name matches this shell pattern as they are, e.g. "
                   "'*.experts.*' (MoE experts stay BF16); repeatable.")
@max_shard_size
@quiet
def convert(src: str, dst: Path, force: bool, embeddings: bool, lm_head: bool,
            cast_to_bf16: bool, keep: tuple[str, ...], max_shard_size: int, quiet: bool) -> None:
    """Convert SRC (HF folder, .gguf file, or hub id owner/name) into the W12 folder DST."""
    from converters.api import convert as run
    from converters.hf import ConvertOptions

    options = ConvertOptions(embeddings=embeddings, lm_head=lm_head, cast_to_bf16=cast_to_bf16,
                             force=force, max_shard_bytes=max_shard_size, keep=tuple(keep))
    report = run(src=src, dst=dst, options=options, progress=not quiet)
    click.echo(
        f"converted {report.converted} of {report.tensors} tensors to W12 "
        f"({report.bits_per_weight:.3f} bits/weight, escape rate {100 * report.escape_rate:.4f}%): "
        f"{_mb(report.source_bytes)} -> {_mb(report.output_bytes)} of tensor data in "
        f"{report.seconds:.1f} s; lossless relative to {report.lossless_relative_to}"
    )
    click.echo(f"wrote {report.dst}")


@click.command(cls=Command)
@click.argument("src")
@click.argument("dst", type=click.Path(path_type=Path))
@quiet
def verify(src: str, dst: Path, quiet: bool) -> None:
    """Check bit for bit that the W12 folder DST holds exactly the tensors of SRC."""
    from converters.api import verify as run

    report = run(src=src, dst=dst, progress=not quiet)
    for problem in report.problems:
        click.echo(f"DIFFERENT {problem}", err=True)
    if not report.ok:
        click.echo(f"FAILED: {len(report.problems)} problem(s); {report.identical} of "
                   f"{report.checked} compared tensors identical", err=True)
        sys.exit(1)
    click.echo(f"OK: all {report.checked} tensors bit-identical ({report.w12_tensors} decoded "
               f"from W12, {_mb(report.compared_bytes)} compared, lossless relative to "
               f"{report.lossless_relative_to})")


@click.command(cls=Command)
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
@click.option("--tensors/--no-tensors", default=True, help="List every tensor (text output).")
def inspect(dst: Path, as_json: bool, tensors: bool) -> None:
    """Storage and exponent statistics of the W12 folder DST."""
    from w12.stats import histogram_bars, inspect_folder

    stats = inspect_folder(folder=dst)
    if as_json:
        click.echo(json.dumps(stats.to_json(), indent=2))
        return
    summary = stats.to_json()
    click.echo(f"{dst}: {len(stats.tensors)} tensors, {summary['w12_tensors']} in W12; "
               f"{_mb(summary['stored_bytes'])} of tensor data, {_mb(stats.file_bytes)} on disk")
    click.echo(f"bits/weight: {stats.bits_per_weight:.3f} over all tensors, "
               f"{stats.w12_bits_per_weight:.3f} over W12 tensors; escape rate "
               f"{100 * stats.escape_rate:.4f}% ({summary['escapes']:,} escapes)")
    if tensors:
        for t in stats.tensors:
            click.echo(f"  {t.name:<60} {t.kind:>9} {str(list(t.shape)):>14} "
                       f"{t.bits_per_weight:7.3f} b/w {t.escapes:>9,} esc")
    click.echo("e0 per row (base exponent):")
    for line in histogram_bars(stats.e0_histogram, label="  "):
        click.echo(line)
    click.echo("exponent offset e - e0 per in-window weight:")
    for line in histogram_bars(dict(enumerate(stats.eoff_histogram)), label="  "):
        click.echo(line)


@click.command(cls=Command)
@click.argument("dst", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@max_shard_size
@quiet
def decode(dst: Path, out: Path, force: bool, max_shard_size: int, quiet: bool) -> None:
    """Write the BF16 Hugging Face folder that the W12 folder DST encodes into OUT."""
    from converters.export import decode_folder

    report = decode_folder(src=dst, dst=out, force=force,
                           max_shard_bytes=max_shard_size, progress=not quiet)
    click.echo(f"decoded {report.decoded} W12 tensors, copied {report.tensors - report.decoded} "
               f"others: {_mb(report.output_bytes)} in {report.shards} shard(s), "
               f"{report.seconds:.1f} s")
    click.echo(f"wrote {report.dst}")


@click.command(cls=Command)
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="W12 output folder (default: in the W12 cache).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@quiet
def demo(out: Path | None, force: bool, quiet: bool) -> None:
    """Get SmolLM2-135M-Instruct, convert GGUF -> BF16 -> W12, verify, and summarise."""
    from converters.demo_models import run_demo

    report = run_demo(out=out, force=force, progress=not quiet)
    convert_report, checked = report.convert, report.verify
    click.echo(f"model      {report.gguf.name}")
    click.echo(f"bf16       {report.hf_folder}  ({_mb(report.hf_bytes)})")
    click.echo(f"w12        {report.w12_folder}  ({_mb(report.w12_bytes)}, "
               f"{100 * report.w12_bytes / max(report.hf_bytes, 1):.1f}% of BF16)")
    click.echo(f"tensors    {convert_report.tensors}, {convert_report.converted} in W12 at "
               f"{convert_report.bits_per_weight:.3f} bits/weight, escape rate "
               f"{100 * convert_report.escape_rate:.4f}%")
    click.echo(f"verify     {'OK' if checked.ok else 'FAILED'}: {checked.identical} of "
               f"{checked.checked} tensors bit-identical")
    click.echo("time       " + ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items()))
    if not checked.ok:
        for problem in checked.problems:
            click.echo(f"DIFFERENT {problem}", err=True)
        sys.exit(1)


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:,.1f} MB"
