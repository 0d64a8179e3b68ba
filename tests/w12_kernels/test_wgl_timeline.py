"""benchmarks/wgl_timeline.py on the CPU: its patches still match the shipped large-M kernel,
its reading of made-up stamps, and its refusal without a GPU."""

import numpy as np
from gemm_helpers import benchmark_module

from w12_kernels.gemm import cuda_large as cl


def test_every_patch_matches_the_shipped_kernel_once():
    tl = benchmark_module("wgl_timeline")
    text = tl.patched(cl.SOURCE_PATH)
    for stamp in range(6):
        assert f"W12_STAMP({stamp})" in text
    assert "w12_tl[W12_BLOCK * 8 + 6]" in text  # (the escape batch's stamp waits on it)
    assert text.count("w12_tl_img[W12_BLOCK * 2") == 2
    # blocks past the stamp slots stamp nothing (any --shapes, no write out of bounds)
    assert f"#define W12_SLOT (W12_BLOCK < {tl.MAX_BLOCKS})" in text
    assert text.count("W12_SLOT") == 5  # the define, W12_STAMP's guard and three stamps by hand
    # the shipped file itself is not touched
    assert "W12_STAMP" not in cl.SOURCE_PATH.read_text()


def test_summary_of_made_up_stamps():
    tl = benchmark_module("wgl_timeline")
    base = 7_000_000  # ns; the counter does not start at 0
    stamps = np.zeros((8, 8), dtype=np.int64)
    # two blocks: entry, first copy issued, loop end, partial met, inbox, stores end (us)
    for b, row in enumerate([(0.5, 2.5, 15.0, 16.0, 16.5, 18.0),
                             (0.7, 2.6, 16.0, 16.2, 16.8, 19.0)]):
        stamps[b, :6] = [base + int(v * 1000) for v in row]
    image = np.zeros((8, 2), dtype=np.int64)
    image[0] = [base, base + 2000]
    image[1] = [base + 100, base + 2300]
    s = tl.summarize(stamps, image)
    assert s["blocks"] == 2
    assert s["image_first_end"] == 2.0 and s["image_last_end"] == 2.3
    assert s["phases"]["entry"] == {"min": 0.5, "median": 0.7, "max": 0.7}
    assert s["phases"]["loop_end"]["min"] == 15.0 and s["phases"]["stores_end"]["max"] == 19.0


def test_a_phase_no_block_stamped_is_left_out():
    """One K range has no inbox: that stamp stays 0 and the phase is not reported."""
    tl = benchmark_module("wgl_timeline")
    stamps = np.zeros((2, 8), dtype=np.int64)
    stamps[0, :6] = [1000, 2000, 3000, 4000, 0, 5000]
    image = np.array([[500, 900], [0, 0]], dtype=np.int64)
    s = tl.summarize(stamps, image)
    assert "inbox" not in s["phases"] and s["phases"]["stores_end"]["median"] == 4.5


def test_without_a_gpu_it_says_so(capsys, monkeypatch):
    tl = benchmark_module("wgl_timeline")
    monkeypatch.setattr(tl.cl, "available", lambda: False)
    assert tl.main(["--shapes", "4096x4096"]) == 2
    assert "needs a compute-capability 9.0 GPU" in capsys.readouterr().err
