"""Writing a plain Hugging Face safetensors checkpoint, streamed shard by shard.

Tensors are buffered until the next one would push the shard past ``max_shard_bytes``; the shard
is then written and the buffer released, so memory holds at most one shard. The number of shards
is known only at the end, so shards are written under provisional names and renamed to
``model-0000i-of-0000N.safetensors`` (plus ``model.safetensors.index.json``) on ``close``; a
single shard becomes ``model.safetensors``, as ``transformers`` writes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from converters.source import INDEX_FILE, SINGLE_FILE


class HFShardWriter:
    """Streams tensors into HF-named safetensors shards in an existing, empty folder."""

    def __init__(self, folder: Path, *, max_shard_bytes: int,
                 metadata: dict[str, str] | None = None) -> None:
        self.folder = Path(folder)
        self.max_shard_bytes = max_shard_bytes
        # "format": "pt" is what transformers expects in the header of a torch checkpoint
        self.metadata = {"format": "pt", **(metadata or {})}
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffer_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self._buffer and self._buffer_bytes + nbytes > self.max_shard_bytes:
            self._flush()
        self._buffer[name] = tensor.contiguous()
        self._buffer_bytes += nbytes
        self.total_bytes += nbytes

    def close(self) -> list[Path]:
        """Write the last shard, name all shards, write the index; return the shard paths."""
        if self._buffer or not self._shards:
            self._flush()
        count = len(self._shards)
        if count == 1:
            final = [self.folder / SINGLE_FILE]
        else:
            final = [self.folder / f"model-{i:05d}-of-{count:05d}.safetensors" for i in
                     range(1, count + 1)]
        weight_map = {}
        for (provisional, names), path in zip(self._shards, final, strict=True):
            provisional.rename(path)
            weight_map.update({name: path.name for name in names})
        if count > 1:
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        return final

    def _flush(self) -> None:
        path = self.folder / f".shard-{len(self._shards) + 1:05d}.partial"
        save_file(self._buffer, str(path), metadata=self.metadata)
        self._shards.append((path, list(self._buffer)))
        self._buffer = {}
        self._buffer_bytes = 0
