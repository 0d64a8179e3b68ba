"""``benchmarks/kernel_regs.py``: the occupancy arithmetic, the ptxas parsing, the table's
instantiations, and (where nvcc is installed) a real offline compile."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from gemm_helpers import benchmark_module

from w12_kernels.gemm import config as cfgs


def _kr():
    return benchmark_module("kernel_regs")


def test_blocks_per_sm_steps():
    kr = _kr()
    # 256-thread blocks: 64 registers fit 4 on a multiprocessor, 65-72 only 3 (allocation in
    # units of 8 registers per thread), 128 two, 129+ one
    assert kr.blocks_per_sm(64, 256, 0) == 4
    assert kr.blocks_per_sm(65, 256, 0) == 3
    assert kr.blocks_per_sm(68, 256, 0) == 3
    assert kr.blocks_per_sm(128, 256, 0) == 2
    assert kr.blocks_per_sm(129, 256, 0) == 1
    # shared memory binds: 100 KB blocks, 2 of them in 228 KB with 1 KB reserved each
    assert kr.blocks_per_sm(32, 256, 100 * 1024) == 2
    # small blocks: the 32-block and 2048-thread limits
    assert kr.blocks_per_sm(16, 32, 0) == 32
    assert kr.blocks_per_sm(16, 1024, 0) == 2
    # 48 registers, 64 threads: 21 by registers, 20 by 10560 B of shared memory
    assert kr.blocks_per_sm(48, 64, 10560) == 20


def test_waves():
    kr = _kr()
    # the launch that #39's first version slowed: 512 blocks, 4 -> 3 per multiprocessor
    assert kr.waves(512, 4) == 1
    assert kr.waves(512, 3) == 2
    assert kr.waves(1, 0) > 10**6


def test_parse_ptxas():
    kr = _kr()
    text = """ptxas info    : Compiling entry function '_Z14w12_gemm_smallILi2ELi1ELb0EEvv' \
for 'sm_90'
ptxas info    : Function properties for _Z14w12_gemm_smallILi2ELi1ELb0EEvv
    0 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers
ptxas info    : Compiling entry function '_Z10w12_decodev' for 'sm_90'
ptxas info    : Function properties for _Z10w12_decodev
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""
    got = kr.parse_ptxas(text)
    assert got == {"_Z14w12_gemm_smallILi2ELi1ELb0EEvv": (128, 12), "_Z10w12_decodev": (32, 0)}
    assert kr._mangled_args("w12_gemm_small<2, 1, false>") == "Li2ELi1ELb0E"


def test_table_instances_cover_every_tuned_shape():
    kr = _kr()
    inst = kr.table_instances()
    shapes = set(cfgs.rule().get("shapes", {}))
    used = {(u.shape, u.nt) for uses in inst.values() for u in uses}
    assert used == {(s, nt) for s in shapes for nt in cfgs.NT_CLASSES}
    for i, uses in inst.items():
        assert i.name.startswith(("w12_gemm_small<", "w12_gemm_small_cl<"))
        assert i.threads % 32 == 0
        # a clustered schedule's block holds kw / cluster of a tile group's warps
        cluster = int(i.name.rsplit(",", 1)[1].rstrip(">")) if "_cl<" in i.name else 1
        assert all(u.grid >= 1 and u.grid % cluster == 0 and i.threads * cluster >= 32 * u.kw
                   for u in uses)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_offline_compile_counts_registers():
    kr = _kr()
    names = sorted({i.name for i in kr.table_instances()})[:2]
    names.append("w12_gemm_small_cl<4, 1, false, 1, 4, 0, 1, 4, 0, 2>")  # a clustered one
    counts = kr.compile_counts(Path(kr.ROOT) / kr.KERNELS, names, shutil.which("nvcc"))
    assert set(counts) == set(names)
    assert all(16 <= regs <= 255 and spill >= 0 for regs, spill in counts.values())


def test_kernel_signature_is_read_from_the_source():
    kr = _kr()
    text = (Path(kr.ROOT) / kr.KERNELS).read_text()
    assert kr.kernel_signature(text) == (
        "(const Words4*, const bf16_t*, bf16_t*, const float*, const int*, const int*, "
        "const float*, const bf16_t*, int, int, int, int, int, int)")
    # a revision with another parameter list instantiates with its own
    other = ("template <int NT>\n__global__ void __launch_bounds__(256, 1) w12_gemm_small(\n"
             "    const Words4* __restrict__ chunks, const int2* __restrict__ first, int M) {}")
    assert kr.kernel_signature(other) == "(const Words4*, const int2*, int)"
    with pytest.raises(SystemExit, match="no w12_gemm_small"):
        kr.kernel_signature("__global__ void something_else(int a) {}")


def test_baseline_shared_memory_is_the_baselines_own(tmp_path):
    kr = _kr()
    saved = tmp_path / "saved"
    saved.mkdir()
    cuda_py = (Path(kr.ROOT) / "w12_kernels/gemm/cuda.py").read_text()
    # a baseline whose epilogue rows took 64 bytes less per tile
    saved.joinpath("cuda.py").write_text(cuda_py.replace("groups * tiles * 512",
                                                         "groups * tiles * 448"))
    base = kr.baseline_shared_bytes(str(saved))
    inst = kr.table_instances(base_shared=base)
    assert inst and all(i.base_smem is not None for i in inst)
    assert {i.smem - i.base_smem for i in inst} <= {64, 128, 192, 256}
    assert any(i.smem != i.base_smem for i in inst)
    with pytest.raises(SystemExit, match="has no kernels.cu"):
        kr.source_at(str(saved), kr.KERNELS, "kernel_regs")
