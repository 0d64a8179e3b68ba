"""The CPU parts of ``compare_revisions`` (inputs, digests, the bit comparison, the ratio table;
the outputs of a tree computed end to end on the CPU) and of ``kernel_sass`` (instantiation
keys, symbols, the main loop)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import compare_revisions as cr
import kernel_sass as ks
import pytest
import torch

LAB = Path(__file__).resolve().parents[1]


def test_inputs_are_seeded_and_carry_escapes():
    a, b = cr.weight(40, 3000, "cpu"), cr.weight(40, 3000, "cpu")
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert torch.isinf(a[-1, 1]) and torch.isnan(a[-1, -1]) and (a == 0).sum() > 100
    assert torch.equal(cr.activations(5, 64, "cpu"), cr.activations(5, 64, "cpu"))
    assert cr.digest(a) == cr.digest(b) and cr.digest(a) != cr.digest(a[:, 1:])


def test_keys_shapes_and_the_workers_split():
    keys = cr.output_keys((64, 32), [1, 64, 65, 128, 256])
    assert [k for k, _, _ in keys] == ["64x32@1", "64x32@64", "64x32@65", "64x32@128",
                                       "64x32@256", "64x32@65/prefill", "64x32@128/prefill"]
    assert cr.parse_list("1,2", "m") == [1, 2] and cr.parse_list("4x8,2x2", "shapes") == [
        (4, 8), (2, 2)]
    for bad, what in (("1,x", "m"), ("0", "m"), ("4x", "shapes"), ("4x8x2", "shapes")):
        with pytest.raises(SystemExit, match="bad"):
            cr.parse_list(bad, what)
    shapes = cr.table_shapes()
    assert (4096, 4096) in shapes and (151936, 5120) in shapes and len(shapes) >= 18
    parts = cr.split(shapes, 4)
    assert sorted(s for p in parts for s in p) == shapes and len(parts) == 4
    assert cr.split([(1, 1)], 4) == [[(1, 1)]]


def test_bits_and_ratios():
    old = {"a@1": "x", "a@2": "y", "b@1": "z"}
    new = {"a@1": "x", "a@2": "w", "c@1": "v"}
    assert cr.compare_bits(old, new) == (["a@2"], ["b@1"], ["c@1"])
    row = dict(n=64, k=32, m=8, w12_us=10.0, cublas_us=15.0)
    rows = cr.ratio_rows([row, {**row, "m": 16}], [{**row, "w12_us": 11.0}, {**row, "m": 32}])
    assert len(rows) == 1 and rows[0]["ratio"] == pytest.approx(1.1)
    assert rows[0]["old_speedup"] == pytest.approx(1.5)
    lines = cr.ratio_table(rows)
    assert "new/old time x1.100" in lines[-2] and lines[-1].startswith("all 1 points")


def test_outputs_of_a_tree_on_the_cpu(tmp_path):
    """``outputs`` end to end on the CPU (the workers, the tree on their import path, the merge)
    and ``bits`` of a tree against itself."""
    root = LAB.parent
    runs = []
    for side in ("a", "b"):
        out = tmp_path / f"{side}.json"
        done = subprocess.run([sys.executable, str(LAB / "compare_revisions.py"), "outputs",
                               "--tree", str(root), "--out", str(out), "--shapes", "40x130,17x64",
                               "--m", "1,3,70", "--device", "cpu", "--workers", "2"],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(out)
    outputs = json.loads(runs[0].read_text())["outputs"]
    assert len(outputs) == 8 and "40x130@70/prefill" in outputs
    done = subprocess.run([sys.executable, str(LAB / "compare_revisions.py"), "bits",
                           *map(str, runs)], capture_output=True, text=True)
    assert done.returncode == 0 and "8 outputs the same, 0 differ" in done.stdout


def test_kernel_sass_keys_and_symbols():
    keys = ks.table_keys()
    kinds = {k[0] for k in keys}
    assert kinds == {"small", "wg", "x_image", "wgl", "permute_x", "decode", "write_escapes"}
    assert len(keys) == len({tuple(k) for k in keys})
    assert ["wgl", 256, 2, 5, 5, 1, 2, 1, 0, 0, 0] in keys  # the table's default
    assert ks._mangled_prefix("w12_gemm_small<1, 2, 1, 1, 0, 1, 8, 0>") == \
        "_Z14w12_gemm_smallILi1ELi2ELi1ELi1ELi0ELi1ELi8ELi0EE"
    assert ks._mangled_prefix("w12_wgl_256_2_5_5_1_rp") == "w12_wgl_256_2_5_5_1_rp"
    src = ("template <int N> __global__ void __launch_bounds__(32) f(const int* __restrict__ a, "
           "float* b, int c) {}")
    assert ks._signature(src, "f<3>") == "(const int*, float*, int)"


def test_kernel_sass_main_loop_and_comparison():
    ins = [(0x10, "MOV R1, c[0x0][0x28]"), (0x20, "HGMMA.64x256x16"), (0x30, "HGMMA.64x256x16"),
           (0x40, "HGMMA.64x256x16"), (0x50, "HGMMA.64x256x16"), (0x60, "BRA 0x20"),
           (0x70, "EXIT")]
    assert len(ks.main_loop(ins)) == 5 and ks.main_loop(ins[:1]) is None
    unit = {"regs": 100, "spill": 0, "sass": ins}
    assert ks.compare("k", unit, unit)[0].endswith("| same; main loop same")
    moved = {**unit, "sass": [(0x10, "MOV R1, c[0x0][0x30]"), *ins[1:]]}
    assert "same but params" in ks.compare("k", moved, unit)[0]
    worse, bad = ks.compare("k", {**unit, "regs": 101}, unit)
    assert bad and "WORSE" in worse


def test_the_script_end_to_end_on_the_cpu(tmp_path):
    """``compare_revisions.sh`` with the old tree given as a folder (``--export``'s), on the
    CPU, no tests and no benchmark: the bits stage compares both trees' outputs."""
    import os
    import shutil

    root = LAB.parent
    old = tmp_path / "old-tree"
    for name in ("w12", "w12_kernels", "benchmarks"):
        shutil.copytree(root / name, old / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "DEVICE": "cpu", "TESTS": "", "BENCH_MODELS": "", "WORKERS": "1",
           "SHAPES": "17x64", "M_LIST": "1,70", "OUT": str(tmp_path / "out"),
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(LAB / "compare_revisions.sh"), str(old)], env=env,
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bits: 3 outputs the same, 0 differ" in done.stdout
    assert "== 3. GPU tests" in done.stdout and "== 4. benchmarks" in done.stdout
    done = subprocess.run(["bash", str(LAB / "compare_revisions.sh"), str(tmp_path / "none")],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "cannot export" in done.stdout
