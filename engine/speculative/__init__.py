"""Speculative decoding on the engine: draft trees, drafters, verification, the decode loop.

``tree`` (the tree type and the best-first builder), ``drafters`` (prompt lookup, early exit),
``block_drafter`` (the trained block drafter; ``train_drafter`` trains it),
``verify`` (one target forward over the tree, acceptance, cache compaction), ``decode`` (the
loop that emits exactly what plain decoding emits).
"""

from engine.speculative.block_drafter import BlockDrafter
from engine.speculative.decode import SpecStats, speculative_generate
from engine.speculative.drafters import Drafter, EarlyExitDrafter, NgramDrafter, make_drafter
from engine.speculative.tree import DraftTree, best_first

__all__ = ["BlockDrafter", "DraftTree", "Drafter", "EarlyExitDrafter", "NgramDrafter", "SpecStats",
           "best_first", "make_drafter", "speculative_generate"]
