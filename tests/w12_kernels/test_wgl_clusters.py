"""benchmarks/wgl_clusters.py on the CPU: the configurations it asks the driver about (the
table's entry with K in 1-4 ranges) and the grids it gives them."""

from gemm_helpers import benchmark_module

from w12_kernels.gemm import cuda_large as cl


def test_variants_are_the_entry_with_each_k_split_the_kernel_takes():
    wc = benchmark_module("wgl_clusters")
    entry = (256, 2, 5, 5, 2, 2, 0, 0)  # 5120x8192's 256-row entry: two K ranges
    got = wc.variants(entry)
    assert entry in got
    assert [c[4] for c in got] == [1, 2, 3, 4]
    assert all(c[:4] == entry[:4] and c[5:] == entry[5:] for c in got)
    for c in got:
        cl.check_config(*c)
    stream_k = (256, 2, 5, 5, 1, 2, 1, 0)
    assert wc.variants(stream_k) == [stream_k]  # one block a multiprocessor: asked as it is


def test_grid_is_the_launchers():
    wc = benchmark_module("wgl_clusters")
    # 5120 rows: 320 tiles of 16, 40 blocks of 128 rows; 256 tokens in one block; 3 ranges
    assert wc.grid_of((256, 2, 5, 5, 3, 2, 0, 0), 5120, 256) == (40, 1, 3)
    # 4096 rows of 64 (a_regs 3), 300 tokens in two blocks of 256
    assert wc.grid_of((256, 1, 5, 8, 2, 3, 0, 0), 4096, 300) == (64, 2, 2)
    # pairs (mcast): an odd tile-block count gets a partner; 300 rows: 19 tiles, 5 blocks of 4
    assert wc.grid_of((256, 1, 5, 8, 1, 3, 0, 1), 300, 256) == (6, 1, 1)
    assert wc.grid_of((256, 1, 5, 8, 1, 3, 0, 0), 300, 256) == (5, 1, 1)
