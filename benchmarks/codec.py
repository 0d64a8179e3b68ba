"""Codec throughput and size on the CPU: encode/decode MB/s of BF16 and bits/weight.

The baseline is a plain copy of the same BF16 tensor, timed in the same run, so the ratios say
how far each codec pass is from a memory copy on this machine. Throughput counts BF16 bytes
(2 per weight) for both directions; every figure is the median of ``--repeats`` runs.

    python benchmarks/codec.py [--rows 4096 --cols 4096 --repeats 7] [--models] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import w12
from w12.codec_torch import encode as torch_encode


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: numba compilation and page faults stay out of the numbers
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def codec_rows(rows: int, cols: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    t = (torch.randn(rows, cols, generator=gen) * 0.02).bfloat16()
    mb = t.numel() * 2 / 1e6
    w = w12.encode(t)
    assert torch.equal(w.decode().view(torch.int16), t.view(torch.int16))
    copy_s = median_seconds(lambda: t.clone(), repeats)
    enc_s = median_seconds(lambda: w12.encode(t), repeats)
    dec_s = median_seconds(w.decode, repeats)
    torch_enc_s = median_seconds(lambda: torch_encode(t), max(1, repeats // 2))
    return {
        "shape": [rows, cols],
        "threads": torch.get_num_threads(),
        "bits_per_weight": w.bits_per_weight,
        "escape_rate": w.num_escapes / t.numel(),
        "copy_MBps": mb / copy_s,
        "encode_MBps": mb / enc_s,
        "decode_MBps": mb / dec_s,
        "torch_encode_MBps": mb / torch_enc_s,
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
    for key in ("copy", "encode", "decode", "torch_encode"):
        print(f"{key:<16}{c[key + '_MBps']:>14.0f}{c[key + '_MBps'] / c['copy_MBps']:>10.2f}")
    for m in result.get("models", []):
        print(f"{m['model']:<44} {m['weights']:>12,d} weights  {m['bits_per_weight']:.4f} bits/w"
              f"  escapes {m['escape_rate']:.2e}")
    print(f"bits/weight {c['bits_per_weight']:.4f} (bar <= 12.02), escape rate "
          f"{c['escape_rate']:.2e}")
    print(f"encode {c['encode_MBps']:.0f} MB/s (bar >= 200), decode {c['decode_MBps']:.0f} MB/s "
          f"(bar >= 500)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
