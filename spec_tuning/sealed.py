"""Sealed evaluation: a held-out final request set that tuning cannot see by accident.

Each request goes to the final set when sha256(seed, request id) falls below the final
fraction, so the split is deterministic, independent of the order and size of the request
list (adding requests never moves old ones), and different for every seed. The tuning set is
an ordinary property. The final set is only returned by ``open_final``, which appends the
access to a JSONL log and refuses a second look at the same split unless ``force=True`` (which
is logged as forced): the final report is meant to touch it exactly once, and the log, not
memory, decides whether it already did.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from w12.errors import W12Error

DEFAULT_FINAL_FRACTION = 0.2


def request_id(request) -> str:
    """A request's id: ``request["id"]`` for mappings, ``request.id`` otherwise."""
    rid = request.get("id") if isinstance(request, Mapping) else getattr(request, "id", None)
    if rid is None:
        raise W12Error(f"sealed split: request has no id: {str(request)[:80]}")
    return str(rid)


def _unit_hash(seed: int, rid: str) -> float:
    digest = hashlib.sha256(f"{seed}\0{rid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class SealedSplit:
    """A deterministic tuning/final split of a request set with a logged final access."""

    def __init__(self, requests: Sequence, *, seed: int, log_path: str | Path,
                 final_fraction: float = DEFAULT_FINAL_FRACTION,
                 id_of: Callable[[object], str] = request_id):
        if not 0.0 < final_fraction < 1.0:
            raise W12Error(f"sealed split: final_fraction={final_fraction} must be in (0, 1)")
        self._requests = list(requests)
        ids = [id_of(r) for r in self._requests]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise W12Error(f"sealed split: duplicate request id {dup!r}")
        self._is_final = [_unit_hash(seed, i) < final_fraction for i in ids]
        self.seed, self.final_fraction, self.log_path = seed, final_fraction, Path(log_path)
        h = hashlib.sha256(f"{seed}\0{final_fraction!r}\0".encode())
        for i in sorted(ids):
            h.update(i.encode() + b"\0")
        self.fingerprint = h.hexdigest()[:16]

    @property
    def tuning(self) -> list:
        return [r for r, fin in zip(self._requests, self._is_final, strict=True) if not fin]

    @property
    def final_size(self) -> int:
        return sum(self._is_final)

    def accesses(self) -> list[dict]:
        """Earlier logged accesses to this split's final set."""
        if not self.log_path.exists():
            return []
        records = [json.loads(line) for line in self.log_path.read_text().splitlines() if line]
        return [r for r in records if r.get("kind") == "final_access"
                and r.get("split") == self.fingerprint]

    def open_final(self, *, reason: str, force: bool = False) -> list:
        """The held-out final set; logged, and refused on a second look unless forced."""
        if not reason.strip():
            raise W12Error("sealed split: open_final needs a reason, it goes into the log")
        earlier = self.accesses()
        if earlier and not force:
            first = earlier[0]
            raise W12Error(
                f"{self.log_path}: final set of split {self.fingerprint} was already opened "
                f"at {first['time_iso']} for {first['reason']!r}; pass force=True to look again"
            )
        if earlier:
            warnings.warn(f"final set of split {self.fingerprint} opened again (look "
                          f"{len(earlier) + 1}), forced: its results are no longer held out",
                          stacklevel=2)
        self._log(reason, forced=bool(earlier))
        return [r for r, fin in zip(self._requests, self._is_final, strict=True) if fin]

    def _log(self, reason: str, *, forced: bool) -> None:
        record = {"kind": "final_access", "split": self.fingerprint, "seed": self.seed,
                  "final_fraction": self.final_fraction, "final_size": self.final_size,
                  "reason": reason, "forced": forced, "time": time.time(),
                  "time_iso": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
