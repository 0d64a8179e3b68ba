"""The tuning memory: every judged proposal, promoted or rejected, with its evidence, in one
versioned JSON file that a user can read, share and merge.

An entry records the requirement it answered (the ceiling factor and the deployment's serving
mode and GPU), the option and value it tried (or, for a code change, the patch's digest and
summary), the verdict and its evidence: the deployment, the paired gain with its bounds and
the A/A noise, the token-forcing verdict, the date and the commit. ``leads`` picks the entries
a new deployment's first round re-measures: an entry is a lead, not a result.

The file is written whole through a temporary file and a rename, so a crash leaves either the
old or the new memory; a file of another format or a newer version is refused, never
overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spec_tuning.registry import FACTORS, MODES
from w12.errors import W12Error

FORMAT = "w12-tune-memory"
VERSION = 1
VERDICTS = ("promoted", "rejected")


@dataclass(frozen=True)
class Entry:
    factor: str  # the ceiling factor the proposal attacked (registry.FACTORS)
    mode: str  # the deployment's serving mode, "single" or "batch"
    gpu: str  # the GPU it was judged on, as detected
    option: str  # the registry option, or "patch" for a code change
    value: object  # the option's value, or the patch's sha256
    verdict: str  # "promoted" or "rejected"
    reason: str  # one line: why (the controller's or token forcing's words)
    evidence: dict = field(default_factory=dict)  # deployment, gain, bounds, noise, forcing
    date: str = ""
    commit: str = ""

    @property
    def id(self) -> str:
        """A digest of what was tried where and its verdict (the same judgement twice, from
        two imports, is one entry)."""
        key = json.dumps([self.factor, self.mode, self.gpu, self.option, self.value,
                          self.verdict, self.date, self.commit], default=str)
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    def check(self) -> Entry:
        if self.factor not in FACTORS:
            raise W12Error(f"memory entry: factor {self.factor!r} is not one of {FACTORS}")
        if self.mode not in MODES:
            raise W12Error(f"memory entry: mode {self.mode!r} is not one of {MODES}")
        if self.verdict not in VERDICTS:
            raise W12Error(f"memory entry: verdict {self.verdict!r} is not one of {VERDICTS}")
        if not self.option:
            raise W12Error("memory entry: no option")
        return self


def _entry(data: dict, where: str) -> Entry:
    names = set(Entry.__dataclass_fields__)
    unknown = set(data) - names - {"id"}
    if unknown:
        raise W12Error(f"{where}: unknown fields {sorted(unknown)}")
    try:
        entry = Entry(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise W12Error(f"{where}: {exc}") from None
    if isinstance(entry.value, list):  # (JSON has no tuples: a widths value comes back a list)
        entry = Entry(**{**asdict(entry), "value": tuple(entry.value)})
    return entry.check()


class Memory:
    """The entries of one memory file (``path``; empty when it does not exist yet)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.entries: list[Entry] = []
        if self.path.exists():
            self.entries = read_entries(self.path)

    def add(self, entry: Entry) -> bool:
        """Add ``entry`` unless an equal one is there; whether it was added."""
        entry.check()
        if any(e.id == entry.id for e in self.entries):
            return False
        self.entries.append(entry)
        return True

    def find(self, prefix: str) -> Entry:
        hits = [e for e in self.entries if e.id.startswith(prefix)]
        if len(hits) != 1:
            raise W12Error(f"{'no' if not hits else len(hits)} memory entries with id "
                           f"{prefix!r} in {self.path}")
        return hits[0]

    def leads(self, factor: str, mode: str, gpu: str | None = None) -> list[Entry]:
        """Promoted entries that answered ``factor`` in ``mode``: those of ``gpu`` first, then
        the others (a lead from another card is still worth a re-measurement)."""
        hits = [e for e in self.entries
                if e.verdict == "promoted" and e.factor == factor and e.mode == mode]
        return sorted(hits, key=lambda e: e.gpu != gpu)

    def save(self) -> None:
        write_entries(self.path, self.entries)

    def merge(self, path: str | Path) -> int:
        """Add the entries of another memory file; how many were new."""
        return sum(self.add(e) for e in read_entries(Path(path)))


def read_entries(path: Path) -> list[Entry]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise W12Error(f"{path}: not a readable memory file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise W12Error(f"{path}: not a {FORMAT} file")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise W12Error(f"{path}: memory version {version!r}; this w12 reads up to {VERSION}")
    return [_entry(e, f"{path}: entry {i}") for i, e in enumerate(data.get("entries", []))]


def write_entries(path: Path, entries: list[Entry]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        read_entries(path)  # refuse to overwrite a file that is not a memory of this version
    body = {"format": FORMAT, "version": VERSION,
            "entries": [{"id": e.id, **asdict(e)} for e in entries]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def default_path() -> Path:
    from w12.env import cache_dir

    return cache_dir() / "tune" / "memory.json"
