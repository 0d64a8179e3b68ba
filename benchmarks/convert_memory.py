"""Peak memory of ``w12 convert`` against the bar ``largest tensor x 3 + 1 GB``.

Each conversion runs in its own child process (the ``w12`` CLI), which writes its own peak resident
set size (``VmHWM`` of ``/proc/self/status``) when it exits. ``ru_maxrss`` of a child is no good
here: Linux carries the parent's high-water mark across fork and exec, so every child would
report at least the parent's size. Cases: the demo
model as a GGUF file (dequantised to BF16 on the way) and as its BF16 folder, and a synthetic
Llama-shaped BF16 checkpoint of ``--synthetic-gb`` in two shards, converted with the default shard
size and with ``--max-shard-size`` (the W12 writer spools tensors to disk, so the two should
agree). The last
lines print peak / bar ratios; ``--json`` writes the rows with the harness's environment record.

    python benchmarks/convert_memory.py [--synthetic-gb 1.5] [--workdir DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from harness import ROOT, environment, project_on_path, write_json
from safetensors import safe_open
from safetensors.torch import save_file

project_on_path()

GB = 10**9


def llama_shapes(target_bytes: int, hidden: int = 2048, ffn: int = 5632,
                 vocab: int = 32000) -> list[tuple[str, tuple[int, int] | tuple[int]]]:
    """Names and shapes of a Llama-like model with as many layers as fit in ``target_bytes``."""
    layer = [("self_attn.q_proj.weight", (hidden, hidden)),
             ("self_attn.k_proj.weight", (hidden // 4, hidden)),
             ("self_attn.v_proj.weight", (hidden // 4, hidden)),
             ("self_attn.o_proj.weight", (hidden, hidden)),
             ("mlp.gate_proj.weight", (ffn, hidden)), ("mlp.up_proj.weight", (ffn, hidden)),
             ("mlp.down_proj.weight", (hidden, ffn)), ("input_layernorm.weight", (hidden,)),
             ("post_attention_layernorm.weight", (hidden,))]
    per_layer = 2 * sum(_numel(shape) for _, shape in layer)
    fixed = 2 * (2 * vocab * hidden + hidden)
    layers = max(1, (target_bytes - fixed) // per_layer)
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        shapes += [(f"model.layers.{i}.{name}", shape) for name, shape in layer]
    return shapes + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def write_synthetic(folder: Path, target_bytes: int, shards: int = 2) -> None:
    """A BF16 HF checkpoint with N(0, 0.02) weights, written one shard at a time."""
    folder.mkdir(parents=True)
    shapes = llama_shapes(target_bytes)
    gen = torch.Generator().manual_seed(0)
    per_shard = -(-len(shapes) // shards)
    weight_map = {}
    for s in range(shards):
        part = shapes[s * per_shard:(s + 1) * per_shard]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {name: (torch.randn(shape, generator=gen) * 0.02).bfloat16()
                   for name, shape in part}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        del tensors
    index = {"metadata": {"total_size": sum(2 * _numel(s) for _, s in shapes)},
             "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))


def largest_tensor_bytes(src: Path) -> int:
    """Largest tensor of a HF folder, or of a GGUF file once dequantised to BF16."""
    if src.is_file():
        from gguf import GGUFReader

        return max(2 * _numel(t.shape) for t in GGUFReader(str(src)).tensors)
    largest = 0
    for shard in src.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                s = f.get_slice(name)
                largest = max(largest, _numel(s.get_shape()) * (2 if s.get_dtype() == "BF16" else
                                                                 4))
    return largest


# runs the CLI and, at exit, writes this process's peak RSS in kB to the file named first
_CHILD = """
import atexit, sys
report = sys.argv.pop(1)
sys.path.insert(0, sys.argv.pop(1))
def peak():
    with open("/proc/self/status") as status:
        kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(report, "w") as out:
        out.write(kb)
atexit.register(peak)
from w12_cli import main
main(prog_name="w12")
"""


def measure(src: Path, dst: Path, extra: list[str], report: Path) -> tuple[int, float, int]:
    """Peak RSS (bytes), seconds and exit code of one ``w12 convert`` child process."""
    command = [sys.executable, "-c", _CHILD, str(report), str(ROOT), "convert", "-q", "--force",
               str(src), str(dst), *extra]
    started = time.perf_counter()
    code = subprocess.run(command, check=False).returncode
    seconds = time.perf_counter() - started
    return int(report.read_text()) * 1024, seconds, code


def _numel(shape) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic-gb", type=float, default=1.5)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from converters.demo_models import demo_gguf_path, demo_hf_folder

    work = args.workdir or Path(tempfile.mkdtemp(prefix="w12-convert-memory-"))
    cases = [("demo GGUF (Q4_1 -> BF16 -> W12)", demo_gguf_path(), []),
             ("demo BF16 folder", demo_hf_folder(progress=False), [])]
    if args.synthetic_gb > 0:
        synthetic = work / "synthetic-bf16"
        if not synthetic.exists():
            print(f"writing a {args.synthetic_gb} GB synthetic checkpoint to {synthetic}",
                  file=sys.stderr)
            write_synthetic(synthetic, int(args.synthetic_gb * GB))
        cases += [(f"synthetic {args.synthetic_gb} GB, 2 shards", synthetic, []),
                  (f"synthetic {args.synthetic_gb} GB, --max-shard-size 500MB", synthetic,
                   ["--max-shard-size", "500MB"])]
    rows = []
    for label, src, extra in cases:
        largest = largest_tensor_bytes(src)
        bar = 3 * largest + GB
        peak, seconds, code = measure(src, work / "out-w12", extra, work / "peak-kb.txt")
        rows.append({"case": label, "largest_tensor_bytes": largest, "bar_bytes": bar,
                     "peak_rss_bytes": peak, "seconds": seconds, "exit_code": code})
    shutil.rmtree(work / "out-w12", ignore_errors=True)
    print(f"{'case':<48} {'largest MB':>10} {'bar GB':>7} {'peak GB':>8} {'time s':>7}")
    for r in rows:
        print(f"{r['case']:<48} {r['largest_tensor_bytes'] / 1e6:>10.1f} "
              f"{r['bar_bytes'] / GB:>7.2f} {r['peak_rss_bytes'] / GB:>8.2f} {r['seconds']:>7.1f}")
    for r in rows:
        verdict = "within" if r["peak_rss_bytes"] <= r["bar_bytes"] else "OVER"
        print(f"peak / bar  {r['case']:<48} {r['peak_rss_bytes'] / r['bar_bytes']:.2f} ({verdict})")
    write_json(args.json, rows, environment("cpu"), synthetic_gb=args.synthetic_gb)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
