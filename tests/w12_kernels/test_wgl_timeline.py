"""benchmarks/wgl_timeline.py on the CPU: its patches still match the shipped large-M kernel,
its reading of made-up stamps, and its refusal without a GPU."""

import numpy as np
import pytest
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
    # the define, W12_STAMP's guard and four stamps by hand (stream-K's segment count, after
    # either of its store paths; the block's multiprocessor, at its entry)
    assert text.count("W12_SLOT") == 6
    # the image pass's own slots, enough for its grid at 512 rows of K 25600 (6400 blocks) and
    # far beyond
    assert f"#define W12_IMG_SLOT (W12_BLOCK < {tl.MAX_IMAGE_BLOCKS})" in text
    assert text.count("W12_IMG_SLOT") == 3 and tl.MAX_IMAGE_BLOCKS >= 8 * 400 * 2 * 8
    assert text.count("w12_tl_sm[W12_BLOCK] = sm;") == 1 and "%%smid" in text
    # stream-K: each segment stamp once in the patched text
    for stamp in ("W12_STAMP(1)", "W12_STAMP(3)", "W12_STAMP(4)"):
        assert text.count(stamp) == 2  # (the non-persistent path's and stream-K's)
    assert text.count("w12_tl[W12_BLOCK * 8 + 7] = (unsigned long long)nseg") == 2
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


def test_without_an_image_pass_the_stamps_count_from_the_first_block():
    """An xorder entry has no image pass (no image stamp): µs from the GEMM's first block
    entry, and no image end."""
    tl = benchmark_module("wgl_timeline")
    stamps = np.zeros((3, 8), dtype=np.int64)
    stamps[0, :6] = [5000, 6000, 9000, 9500, 0, 10000]
    stamps[1, :6] = [4000, 6500, 9200, 9400, 0, 11000]
    image = np.zeros((4, 2), dtype=np.int64)
    assert tl.start_time(stamps, image) == 4000
    s = tl.summarize(stamps, image)
    assert s["image_first_end"] is None and s["image_last_end"] is None
    assert s["phases"]["entry"] == {"min": 0.0, "median": 1.0, "max": 1.0}
    assert s["phases"]["stores_end"]["max"] == 7.0


def test_without_a_gpu_it_says_so(capsys, monkeypatch):
    tl = benchmark_module("wgl_timeline")
    monkeypatch.setattr(tl.cl, "available", lambda: False)
    assert tl.main(["--shapes", "4096x4096"]) == 2
    assert "needs a compute-capability 9.0 GPU" in capsys.readouterr().err


def test_stream_k_durations_of_made_up_stamps():
    """Three blocks: one segment (a whole unit), a piece then an owner's unit, a piece then a
    unit of its own (not cut): each duration from the right pair of stamps."""
    tl = benchmark_module("wgl_timeline")
    stamps = np.zeros((4, 8), dtype=np.int64)
    us = 1000
    # entry, seg0 loop end, seg0 end, last loop end, pieces added, last end, (6), segments
    stamps[0] = [1 * us, 20 * us, 23 * us, 0, 0, 23 * us, 0, 1]
    stamps[1] = [1 * us, 10 * us, 11 * us, 25 * us, 29 * us, 31 * us, 0, 2]
    stamps[2] = [2 * us, 12 * us, 13 * us, 27 * us, 0, 30 * us, 0, 2]
    d = tl.stream_k_durations(stamps)
    assert d["segments"] == {1: 1, 2: 2}
    assert d["seg0_start_and_loop"] == {"blocks": 3, "min": 9.0, "median": 10.0, "max": 19.0}
    assert d["seg0_epilogue"]["max"] == 3.0 and d["seg0_epilogue"]["min"] == 1.0
    assert d["last_loop"] == {"blocks": 2, "min": 14.0, "median": 14.0, "max": 14.0}
    assert d["owner_wait_and_add"] == {"blocks": 1, "min": 4.0, "median": 4.0, "max": 4.0}
    assert d["owner_stores"]["median"] == 2.0
    assert d["last_stores_unowned"] == {"blocks": 1, "min": 3.0, "median": 3.0, "max": 3.0}


def test_entries_it_cannot_stamp_are_named_not_run(monkeypatch):
    """``table_config`` refuses (``NotStamped``, which ``main`` reports and skips) the entries
    the stamps do not cover: tail launches, no warpgroup entry; and gives a stamped entry's
    keywords, its ``wreuse``, ``xorder`` and ``l2hint`` included, at the row count asked."""
    from w12_kernels.gemm import config as cfgs

    tl = benchmark_module("wgl_timeline")
    base = {**cfgs.DEFAULT_LARGE, "kind": "wgmma", "tiles": 8, "block_m": 256, "num_stages": 5,
            "w_stages": 5, "splits": 1, "a_regs": 2}
    rule = {"default": {"kind": "decode"}, "max_m": 512, "shapes": {
        "100x64": {"512": {**base, "xorder": 1}}, "200x64": {"512": {**base, "tail": 2}},
        "300x64": {"512": {"kind": "decode"}},
        "400x64": {"256": base, "512": {**base, "persist": 1, "wreuse": 1}}}}
    monkeypatch.setattr(cfgs, "large_rule", lambda *_: rule)
    for n, why in ((200, "tail"), (300, "no warpgroup entry")):
        with pytest.raises(tl.NotStamped, match=why):
            tl.table_config(n, 64, 512)
    assert tl.table_config(100, 64, 512)["xorder"] is True
    assert tl.table_config(400, 64, 512)["xorder"] is False
    assert tl.table_config(400, 64, 512)["l2hint"] is False
    assert tl.table_config(400, 64, 512)["persist"] == 1
    assert tl.table_config(400, 64, 512)["wreuse"] is True
    assert tl.table_config(400, 64, 256)["wreuse"] is False


def test_stream_k_step_rates_per_block():
    """A stream-K block's loops over its steps: one segment from the consumers' start to its
    loop's end; two, to the last loop's end less the first segment's epilogue; blocks that
    stamped nothing are left out; each with its SM index."""
    tl = benchmark_module("wgl_timeline")
    us = 1000  # (stamps in ns)
    stamps = np.zeros((4, 8), dtype=np.int64)
    # entry, seg0_loop_end, seg0_end, last_loop_end, pieces_added, last_end, start, segments
    stamps[0] = [1 * us, 101 * us, 104 * us, 0, 0, 0, 2 * us, 1]
    stamps[1] = [1 * us, 40 * us, 50 * us, 120 * us, 125 * us, 128 * us, 2 * us, 2]
    rates = tl.stream_k_step_rates(stamps, np.array([7, 9, 0, 0]), [0, 99, 207, 300, 400])
    assert [(r["block"], r["sm"], r["steps"]) for r in rates] == [(0, 7, 99), (1, 9, 108)]
    assert rates[0]["us_per_step"] == pytest.approx(99 / 99)
    assert rates[1]["us_per_step"] == pytest.approx((118 - 10) / 108)
