"""``benchmarks/wgl_sass.py``: finding the large-M kernel's main loop in a disassembly, the
ptxas parsing, the table's configurations, the sources at a revision, and (where nvcc and
cuobjdump are installed) a real offline compile."""

from __future__ import annotations

import shutil

import pytest
from gemm_helpers import benchmark_module

from w12_kernels.gemm import config, cuda_large

# a disassembly in cuobjdump's layout: a prologue, an outer loop (0x0040-0x0120) holding an
# inner one (0x0060-0x00e0) with four MMAs, a divergence check and a uniform operation, and a
# second function whose MMAs must not be counted
SASS = """
        Function : w12_wgl_test
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x000 */
        /*0040*/                   IMAD R2, R3, R4, RZ ;                  /* 0x000 */
        /*0060*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R5], R6 ;
        /*0070*/                   HGMMA.64x256x16.F32.BF16 R24, R152, gdesc[UR4], R24 ;
        /*0080*/                   HGMMA.64x256x16.F32.BF16 R24, R156, gdesc[UR4], R24 ;
        /*0090*/                   BRA.DIV UR5, 0x0200 ;
        /*00a0*/                   HGMMA.64x256x16.F32.BF16 R24, R160, gdesc[UR4], R24 ;
        /*00b0*/                   HGMMA.64x256x16.F32.BF16 R24, R164, gdesc[UR4], R24, gsb0 ;
        /*00c0*/                   UIADD3 UR6, UR6, 0x1, URZ ;
        /*00d0*/               @!P0 IADD3 R7, R7, 0x1, RZ ;
        /*00e0*/               @!P1 BRA 0x0060 ;
        /*00f0*/                   STG.E.U16 desc[UR8][R10.64], R11 ;
        /*0120*/               @P2 BRA 0x0040 ;
        /*0130*/                   EXIT ;
        Function : w12_permute_x
        /*0000*/                   HGMMA.64x256x16.F32.BF16 R24, R152, gdesc[UR4], R24 ;
        /*0010*/                   BRA 0x0000 ;
"""


def _ws():
    return benchmark_module("wgl_sass")


def test_main_loop_is_the_innermost_loop_holding_the_mmas():
    loop = _ws().main_loop(SASS, "w12_wgl_test")
    assert (loop.instructions, loop.mmas, loop.divergence_checks, loop.uniform) == (9, 4, 1, 1)
    with pytest.raises(ValueError, match="no function"):
        _ws().main_loop(SASS, "w12_wgl_other")
    with pytest.raises(ValueError, match="no loop"):
        _ws().main_loop(SASS.replace("HGMMA", "NOP"), "w12_wgl_test")


def test_ptxas_parsing_of_the_extern_c_entries():
    text = ("ptxas info    : Compiling entry function 'w12_wgl_a' for 'sm_90a'\n"
            "    0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
            "ptxas info    : Used 168 registers, used 1 barriers\n"
            "ptxas info    : Compiling entry function 'w12_permute_x' for 'sm_90a'\n"
            "ptxas info    : Used 20 registers\n")
    assert _ws().parse_ptxas(text) == {"w12_wgl_a": (168, 8), "w12_permute_x": (20, 0)}


def test_table_configurations_are_distinct_warpgroup_entries():
    rule = {"default": {"kind": "wgmma", "tiles": 8, "block_m": 256, "num_stages": 5,
                        "w_stages": 5, "splits": 2, "a_regs": 2},
            "shapes": {"4096x4096": {"256": {"splits": 3}, "1024": {"kind": "decode"}},
                       "8192x8192": {"256": {"splits": 2}},
                       "5120x5120": {"128": {"block_m": 128, "a_regs": 1}},
                       "6144x4096": {"256": {"splits": 1, "persist": 1}}}}
    assert _ws().table_configs(rule) == [(256, 2, 5, 5, 2, 2, 0, 0), (256, 2, 5, 5, 3, 2, 0, 0),
                                         (128, 2, 5, 5, 2, 1, 0, 0), (256, 2, 5, 5, 1, 2, 1, 0)]
    # a stream-K default: a shape's entry inherits all of it but ``persist`` (as the lookup)
    rule["default"].update(splits=1, persist=1)
    assert _ws().table_configs(rule)[:2] == [(256, 2, 5, 5, 1, 2, 1, 0), (256, 2, 5, 5, 3, 2, 0, 0)]
    # an entry with a tail: its one-range configuration and the tail's (nor is ``tail``
    # inherited from a default that has one)
    rule["default"].update(persist=0, tail=2)
    rule["shapes"]["8192x8192"]["512"] = {"splits": 1, "tail": 4}
    got = _ws().table_configs(rule)
    assert got[0] == (256, 2, 5, 5, 1, 2, 0, 0) and (256, 2, 5, 5, 2, 2, 0, 0) in got
    assert (256, 2, 5, 5, 4, 2, 0, 0) in got
    rule["shapes"]["8192x8192"]["512"] = {"splits": 1, "tail": 1}  # stream-K's
    assert (256, 2, 5, 5, 1, 2, 1, 0) in _ws().table_configs(rule)
    assert config.large_config(6144, 4096, 256, {**rule, "max_m": 1024}).tail == 0
    shipped = _ws().table_configs()
    assert shipped and all(len(c) == 8 for c in shipped)
    for cfg in shipped:
        cuda_large.check_config(*cfg)
    # every warpgroup entry the launcher's lookup makes of the shipped table is among them
    table = config.large_rule()
    for shape, by_m in table["shapes"].items():
        n, k = map(int, shape.split("x"))
        for m in by_m:
            c = config.large_config(n, k, int(m), table)
            if c.kind == "wgmma":
                key = (c.block_m, c.tiles // 4, c.num_stages, c.w_stages, c.splits,
                       int(c.a_regs), int(c.persist), int(c.mcast))
                assert key in shipped, (shape, m)
                if c.tail:
                    assert cuda_large.tail_config(key, c.tail) in shipped, (shape, m)


def test_sources_of_the_tree_and_of_a_revision():
    ws = _ws()
    cfg = [(256, 2, 5, 5, 1, 2)]
    tree = ws.sources(cfg, None)
    assert list(tree) == ["w12_wgl_256_2_5_5_1_rp"]
    assert tree["w12_wgl_256_2_5_5_1_rp"] == cuda_large.source(*cfg[0])
    if shutil.which("git") is None:
        pytest.skip("needs git")
    try:
        head = ws.sources(cfg, "HEAD")
    except SystemExit as exc:  # (a checkout without history, e.g. an exported tree)
        pytest.skip(str(exc))
    assert "wgl_body<256, 2, 5, 5, 1, 2" in head["w12_wgl_256_2_5_5_1_rp"]


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("cuobjdump") is None
                    or shutil.which("nvdisasm") is None, reason="needs the CUDA toolkit")
def test_offline_compile_finds_the_loop():
    ws = _ws()
    name, text = next(iter(ws.sources([(256, 2, 5, 5, 1, 2)], None).items()))
    loop, regs, spill = ws.measure(name, text, shutil.which("nvcc"), shutil.which("cuobjdump"))
    assert loop.mmas == 8 and loop.instructions > 100 and regs > 0 and spill == 0
