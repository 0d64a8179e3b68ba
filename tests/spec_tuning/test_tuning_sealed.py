"""Sealed evaluation: deterministic split, loud and logged access to the final set."""

import json

import pytest

from spec_tuning.sealed import SealedSplit
from w12.errors import W12Error

REQUESTS = [{"id": f"req-{i}", "prompt": f"p{i}"} for i in range(500)]


def _ids(requests):
    return {r["id"] for r in requests}


def test_split_is_deterministic_and_order_independent(tmp_path):
    a = SealedSplit(REQUESTS, seed=3, log_path=tmp_path / "a.jsonl")
    b = SealedSplit(REQUESTS[::-1], seed=3, log_path=tmp_path / "b.jsonl")
    assert _ids(a.tuning) == _ids(b.tuning)
    assert a.fingerprint == b.fingerprint
    final = a.open_final(reason="test")
    assert _ids(final) | _ids(a.tuning) == _ids(REQUESTS)
    assert not _ids(final) & _ids(a.tuning)
    assert 60 <= len(final) <= 140  # 20% of 500, within binomial spread


def test_adding_requests_never_moves_old_ones(tmp_path):
    small = SealedSplit(REQUESTS[:300], seed=3, log_path=tmp_path / "log.jsonl")
    large = SealedSplit(REQUESTS, seed=3, log_path=tmp_path / "log.jsonl")
    assert _ids(small.tuning) == _ids(large.tuning) & _ids(REQUESTS[:300])
    assert small.fingerprint != large.fingerprint


def test_seeds_give_different_splits(tmp_path):
    a = SealedSplit(REQUESTS, seed=1, log_path=tmp_path / "log.jsonl")
    b = SealedSplit(REQUESTS, seed=2, log_path=tmp_path / "log.jsonl")
    assert _ids(a.tuning) != _ids(b.tuning)


def test_second_look_is_refused_unless_forced(tmp_path):
    log = tmp_path / "sealed.jsonl"
    split = SealedSplit(REQUESTS, seed=7, log_path=log)
    first = split.open_final(reason="final report")
    # A fresh object (another process) sees the access in the log.
    again = SealedSplit(REQUESTS, seed=7, log_path=log)
    with pytest.raises(W12Error, match="already opened .* for 'final report'"):
        again.open_final(reason="peek")
    with pytest.warns(UserWarning, match="no longer held out"):
        forced = again.open_final(reason="re-run of the report", force=True)
    assert forced == first
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["forced"] for r in records] == [False, True]
    assert [r["reason"] for r in records] == ["final report", "re-run of the report"]
    other = SealedSplit(REQUESTS, seed=8, log_path=log)
    assert other.open_final(reason="another split")  # a different split is not blocked


def test_bad_inputs_are_user_errors(tmp_path):
    log = tmp_path / "log.jsonl"
    with pytest.raises(W12Error, match="duplicate request id 'x'"):
        SealedSplit([{"id": "x"}, {"id": "x"}], seed=0, log_path=log)
    with pytest.raises(W12Error, match="has no id"):
        SealedSplit([{"prompt": "no id"}], seed=0, log_path=log)
    with pytest.raises(W12Error, match="final_fraction=1.5"):
        SealedSplit(REQUESTS, seed=0, log_path=log, final_fraction=1.5)
    with pytest.raises(W12Error, match="needs a reason"):
        SealedSplit(REQUESTS, seed=0, log_path=log).open_final(reason=" ")
