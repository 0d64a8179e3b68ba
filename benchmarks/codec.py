"""Codec throughput and size on the CPU: encode/decode MB/s of BF16 and bits/weight.

The baseline is a plain copy of the same BF16 tensor, timed in the same run, so the ratios say
how far each codec pass is from a memory copy on this machine. Throughput counts BF16 bytes
(2 per weight) for both directions; every figure is the median of ``--repeats`` rounds in which
the copy and the codec passes run in turn (``harness.time_host``), after one untimed round
(numba compilation and page faults stay out of the numbers).

    python benchmarks/codec.py [--rows 4096 --cols 4096 --repeats 7] [--models] [--json out.json]
"""

from __future__ import annotations

import argparse

import torch
from harness import environment, project_on_path, time_host, write_json

project_on_path()

import w12  # noqa: E402
from w12.codec_torch import encode as torch_encode  # noqa: E402

PASSES = ("copy", "encode", "decode", "torch_encode")


def codec_rows(rows: int, cols: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    t = (torch.randn(rows, cols, generator=gen) * 0.02).bfloat16()
    mb = t.numel() * 2 / 1e6
    w = w12.encode(t)
    assert torch.equal(w.decode().view(torch.int16), t.view(torch.int16))
    calls = (lambda: t.clone(), lambda: w12.encode(t), w.decode, lambda: torch_encode(t))
    time_host(calls, rounds=1)  # untimed round
    seconds = time_host(calls, rounds=repeats)
    return {
        "shape": [rows, cols],
        "threads": torch.get_num_threads(),
        "bits_per_weight": w.bits_per_weight,
        "escape_rate": w.num_escapes / t.numel(),
        **{f"{name}_MBps": mb / s for name, s in zip(PASSES, seconds, strict=True)},
    }


def model_rows() -> list[dict]:
    """bits/weight of every 2-D linear weight of the two real models (converter's default set)."""
    from safetensors import safe_open

    from converters import demo_models  # lazy: benchmarks may import anything, w12 may not

    out = []
    for label, folder in (
        ("SmolLM2-135M-Instruct (GGUF Q4_1 -> BF16)", demo_models.demo_hf_folder()),
        ("all-MiniLM-L6-v2 (FP32 -> BF16 cast)", demo_models.minilm_folder()),
    ):
        weights = stored = escapes = 0
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    if t.dim() != 2 or "embed" in name or name.startswith("lm_head"):
                        continue
                    w = w12.encode(t.bfloat16())
                    weights += t.numel()
                    stored += w.nbytes
                    escapes += w.num_escapes
        out.append(
            {
                "model": label,
                "weights": weights,
                "bits_per_weight": 8 * stored / weights,
                "escape_rate": escapes / weights,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--models", action="store_true", help="also size the two real demo models")
    ap.add_argument("--json", help="write results to this file")
    args = ap.parse_args()

    result = {"codec": codec_rows(args.rows, args.cols, args.repeats)}
    if args.models:
        result["models"] = model_rows()
    c = result["codec"]
    print(f"N(0, 0.02) BF16 {args.rows}x{args.cols}, {c['threads']} threads, median of "
          f"{args.repeats}")
    print(f"{'pass':<16}{'MB/s of BF16':>14}{'vs copy':>10}")
    for key in PASSES:
        print(f"{key:<16}{c[key + '_MBps']:>14.0f}{c[key + '_MBps'] / c['copy_MBps']:>10.2f}")
    for m in result.get("models", []):
        print(f"{m['model']:<44} {m['weights']:>12,d} weights  {m['bits_per_weight']:.4f} bits/w"
              f"  escapes {m['escape_rate']:.2e}")
    print(f"bits/weight {c['bits_per_weight']:.4f} (bar <= 12.02), escape rate "
          f"{c['escape_rate']:.2e}")
    print(f"encode {c['encode_MBps']:.0f} MB/s (bar >= 200), decode {c['decode_MBps']:.0f} MB/s "
          f"(bar >= 500)")
    settings = {k: v for k, v in vars(args).items() if k != "json"}  # not where it ran
    write_json(args.json, [c, *result.get("models", [])], environment("cpu"), settings=settings)


if __name__ == "__main__":
    main()
