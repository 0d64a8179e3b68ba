"""A target for Nsight Compute: ``w12_linear`` on some layer shapes and row counts, each called
twice (the first call compiles the kernel and loads the table), nothing else on the GPU.

Profile every call with, for example:

    ncu --clock-control none --kernel-name regex:w12_gemm_small --section WarpStateStats \\
        --page raw --csv python3 lab/ncu_target.py --shapes 6144x4096,4096x4096 --m 16,32

The script prints which launch is which (2 i: the compile call of the i-th (shape, M), 2 i + 1:
the one to read). ``--large-config`` runs the large-M warpgroup kernel with one configuration
(``WglConfig``'s fields, ``256,2,5,5,1,2,1``) instead of the table's choice;
``--cublas`` adds cuBLAS BF16 (``torch.nn.functional.linear``) on the exact weights after each
W12 call, so that both kernels of one shape are profiled side by side. Random data, never zeros.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gemm_tuning import large as large_step  # noqa: E402

import w12  # noqa: E402
from w12_kernels.gemm import w12_linear  # noqa: E402
from w12_kernels.gemm.large.launcher import WglConfig  # noqa: E402
from w12_kernels.gemm.layout import prepare_weight  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # (the CPU: a dry run of the script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="6144x4096", help="NxK,NxK,...")
    parser.add_argument("--m", default="16,32", help="row counts, comma-separated")
    parser.add_argument("--large-config", default=None,
                        help="WglConfig's fields in order: block_m,warpgroups,x_stages,"
                             "w_stages,splits,a_regs[,persist,tail,xorder,wreuse,l2hint]")
    parser.add_argument("--cublas", action="store_true", help="also profile cuBLAS BF16")
    args = parser.parse_args()
    # the large-M kernel with one configuration (None: the table's choice)
    large = (large_step.runner(WglConfig(*map(int, args.large_config.split(","))))
             if args.large_config else None)
    torch.manual_seed(0)
    launch = 0
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        weight = (torch.randn(n, k, device=DEVICE) * 0.02).to(torch.bfloat16)
        pw = prepare_weight(w12.encode(weight), device=DEVICE)
        if not args.cublas:
            del weight
        for m in map(int, args.m.split(",")):
            x = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
            for call in ("compile", "profile"):
                if large is None:
                    w12_linear(x, pw)
                else:
                    large(x, pw)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                print(f"launch {launch}: {n}x{k} M={m} ({call})", flush=True)
                launch += 1
                if args.cublas:
                    torch.nn.functional.linear(x, weight)
                    if DEVICE == "cuda":
                        torch.cuda.synchronize()
                    print(f"launch {launch}: {n}x{k} M={m} cuBLAS ({call})", flush=True)
                    launch += 1


if __name__ == "__main__":
    main()
