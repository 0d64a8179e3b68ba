"""``sglang_integration.shard``: a rank's block of a W12 tensor is a valid W12 tensor that
decodes to exactly the block of the original BF16 weight, for every row and column range."""

from __future__ import annotations

import pytest
import torch
from sglang_checkpoint import weight

import w12
from sglang_integration import shard
from w12.tensor import W12Tensor


def _block(w: W12Tensor, rows: shard.Rows, cols: shard.Columns) -> W12Tensor:
    dense = [shard.slice_dense(part, getattr(w, part), rows, cols) for part in shard.DENSE]
    piece = shard.slice_escapes(w.esc_rowptr, w.esc_col, w.esc_val, rows, cols)
    return W12Tensor(*dense, *shard.assemble([piece]))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("k", [7, 8], ids=["K7", "K8"])
def test_every_column_block_decodes_to_the_block(k):
    source = weight((5, k), seed=k, special_rate=0.25)
    encoded = w12.encode(source)
    assert encoded.num_escapes > 0
    rows = shard.Rows(0, 0, 5, 5)
    for start in range(k):
        for count in range(1, k - start + 1):
            block = _block(encoded, rows, shard.Columns(start, count, k))
            block.validate(f"columns {start}+{count}")
            assert torch.equal(_bits(block.decode()), _bits(source[:, start : start + count]))


def test_row_blocks_land_at_their_local_rows():
    source = weight((9, 6), seed=3, special_rate=0.25)
    encoded = w12.encode(source)
    cols = shard.Columns(0, 6, 6)
    blocks = [shard.Rows(local, ckpt, count, 9)
              for local, ckpt, count in ((0, 6, 3), (3, 0, 2), (5, 2, 4))]
    pieces = [shard.slice_escapes(encoded.esc_rowptr, encoded.esc_col, encoded.esc_val, rows,
                                  cols) for rows in blocks]
    rowptr, col, val = shard.assemble(pieces[::-1])  # arrival order must not matter
    dense = {part: torch.cat([shard.slice_dense(part, getattr(encoded, part), rows, cols)
                              for rows in blocks]) for part in shard.DENSE}
    joined = W12Tensor(dense["hi"], dense["lo"], dense["e0"], rowptr, col, val)
    joined.validate("joined")
    expected = torch.cat([source[6:9], source[0:2], source[2:6]])
    assert torch.equal(_bits(joined.decode()), _bits(expected))


def test_zero_rows_decode_to_positive_zero():
    rowptr, col, val = shard.assemble([shard.zero_rows(0, 3, 5)])
    zeros = W12Tensor(torch.zeros(3, 5, dtype=torch.uint8), torch.zeros(3, 3, dtype=torch.uint8),
                      torch.ones(3, dtype=torch.uint8), rowptr, col, val)
    zeros.validate("padding")
    assert torch.equal(_bits(zeros.decode()), torch.zeros(3, 5, dtype=torch.int16))


def test_narrow_index_dtypes_from_the_file_are_widened():
    source = weight((4, 300), seed=5)
    encoded = w12.encode(source)
    rows, cols = shard.Rows(0, 1, 2, 4), shard.Columns(257, 43, 300)
    narrow = shard.slice_escapes(encoded.esc_rowptr.to(torch.uint16),
                                 encoded.esc_col.to(torch.uint16), encoded.esc_val, rows, cols)
    wide = shard.slice_escapes(encoded.esc_rowptr, encoded.esc_col, encoded.esc_val, rows, cols)
    assert narrow.col.dtype == torch.int32 and narrow.counts.dtype == torch.int64
    assert torch.equal(narrow.col, wide.col) and torch.equal(narrow.counts, wide.counts)
    assert torch.equal(narrow.val, wide.val) and int(wide.counts.sum()) > 0


@pytest.mark.parametrize(("shape", "expected", "matches"), [
    ((4, 6), (4, 6), True),
    ((9,), (-1,), True),
    ((4, 6), (4, 7), False),
    ((4, 6), (4,), False),
])
def test_shape_matches(shape, expected, matches):
    assert shard.shape_matches(shape, expected) is matches
