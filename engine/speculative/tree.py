"""Draft trees: the type, the tables verification needs, and the best-first builder.

A ``DraftTree`` holds N nodes per request. Node 0 is the root: the last committed token,
whose key and value are not in the cache yet (plain decoding feeds that token too); every other
node is a drafted token with a parent of lower index, so index order is a topological order.
A chain is the tree whose node n has parent n - 1. Nodes past what a drafter proposed are
padding (``valid`` False): they are computed in verification (fixed shapes for CUDA graphs)
and never accepted.

``best_first`` builds the tree a node budget allows from a drafter's per-position top-k
(tokens and log-probabilities of the distribution at depth 1, 2, ...): the N - 1 drafted nodes
are the N - 1 best paths by summed log-probability, the set a best-first search over the
K-ary tree visits (pop the best node, push its next sibling and its first child). Because a
child never scores above its parent, that set is the union of each depth's best candidates, so
it is found depth by depth with a ``topk`` over (survivors x K) candidates: fixed shapes, no
host loop, on whatever device the inputs live. ``best_first_reference`` is the heap search
itself, for tests.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

# ties between a node and its descendants (log-probability 0) go to the shallower one
_DEPTH_TIE = 1e-6


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [B, N] int64
    parents: torch.Tensor  # [B, N] int64, -1 at the root, parents[b, n] < n
    depth: torch.Tensor  # [B, N] int64, 0 at the root
    valid: torch.Tensor  # [B, N] bool, False for padding
    scores: torch.Tensor | None = None  # [B, N] float32 drafter log-probability of the path
    levels: int | None = None  # a bound, known on the host, on the nodes of any path (the
    # deepest depth + 1); None: the node count

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @classmethod
    def chain(cls, root: torch.Tensor, drafted: torch.Tensor,
              lengths: torch.Tensor | None = None) -> DraftTree:
        """Root [B] followed by a chain of drafted tokens [B, D]; ``lengths`` [B] (default D)
        marks how many of each row's drafted tokens are real, the rest padding."""
        b, d = drafted.shape
        n = torch.arange(d + 1, device=drafted.device)
        tokens = torch.cat([root[:, None], drafted], dim=1)
        valid = torch.ones(b, d + 1, dtype=torch.bool, device=drafted.device)
        if lengths is not None:
            valid = n[None, :] <= lengths[:, None]
        depth, parents = n.expand(b, d + 1), (n - 1).expand(b, d + 1)
        return cls(tokens, parents.clone(), depth.clone(), valid, levels=d + 1)

    def ancestor_mask(self) -> torch.Tensor:
        """[B, N, N] boolean: ``mask[b, n, m]`` when node m is on node n's path (n included).

        The transitive closure of the parent relation by repeated squaring: ceil(log2 N)
        small matrix products, fixed shapes, no host loop over nodes."""
        b, n = self.tokens.shape
        eye = torch.eye(n, device=self.tokens.device)
        reach = eye + torch.zeros(b, n, n, device=self.tokens.device).scatter_(
            2, self.parents.clamp(min=0)[..., None], (self.parents >= 0)[..., None].float())
        for _ in range(max(1, (n - 1).bit_length())):
            reach = (reach @ reach).clamp(max=1.0)
        return reach > 0

    def paths(self) -> torch.Tensor:
        """[B, N, N] node indices of each node's path from the root down to itself, then -1."""
        b, n = self.tokens.shape
        mask = self.ancestor_mask()
        nodes = torch.arange(n, device=self.tokens.device).expand(b, n, n)
        level = torch.where(mask, self.depth[:, None, :], n)  # ancestor m sits at its depth
        out = torch.full((b, n, n + 1), -1, dtype=torch.long, device=self.tokens.device)
        return out.scatter_(2, level, nodes)[..., :n]


def best_first(root: torch.Tensor, top_tokens: torch.Tensor, top_logp: torch.Tensor,
               budget: int) -> DraftTree:
    """The best ``budget - 1`` drafted nodes over per-position top-k candidates, plus the root.

    ``root`` [B]; ``top_tokens`` / ``top_logp`` [B, D, K]: at depth d + 1 the candidates
    (distinct tokens, log-probabilities sorted descending) of the drafter's distribution. Nodes
    come out depth by depth, each depth best first; rows with fewer than ``budget - 1``
    candidates in total are padded."""
    b, depth_max, k = top_tokens.shape
    want = budget - 1
    device = top_tokens.device
    level_scores, level_tokens, level_parents = [], [], []
    scores = torch.zeros(b, 1, device=device)  # the survivors of the previous depth
    prev_start = next_start = 0  # where the previous / this depth's survivors begin
    for d in range(depth_max if want > 0 else 0):
        cand = scores[:, :, None] + top_logp[:, d, None, :].float()  # [B, S, K]
        width = min(want, cand.shape[1] * k)
        scores, flat = cand.flatten(1).topk(width, dim=1)
        level_scores.append(scores)
        level_tokens.append(top_tokens[:, d].gather(1, flat % k))
        level_parents.append(flat // k + prev_start if d else torch.full_like(flat, -1))
        prev_start, next_start = next_start, next_start + width
    if not level_scores:
        return DraftTree(root[:, None], torch.full((b, 1), -1, device=device),
                         torch.zeros(b, 1, dtype=torch.long, device=device),
                         torch.ones(b, 1, dtype=torch.bool, device=device),
                         torch.zeros(b, 1, device=device), levels=1)
    depth = torch.cat([torch.full_like(s, d + 1, dtype=torch.long)
                       for d, s in enumerate(level_scores)], dim=1)
    scores = torch.cat(level_scores, dim=1)
    tokens = torch.cat(level_tokens, dim=1)
    parents = torch.cat(level_parents, dim=1)
    total = scores.shape[1]
    take = min(want, total)
    keep_key = scores - _DEPTH_TIE * depth
    chosen = torch.zeros(b, total, dtype=torch.bool, device=device)
    chosen.scatter_(1, keep_key.topk(take, dim=1).indices, True)
    # kept candidates in union order (depth by depth, best first), then the rest
    position = torch.arange(total, device=device).expand(b, total)
    order = torch.where(chosen, position, position + total).argsort(dim=1)[:, :take]
    new_index = torch.full((b, total), -1, dtype=torch.long, device=device)
    new_index.scatter_(1, order, torch.arange(1, take + 1, device=device).expand(b, take))
    parent_union = parents.gather(1, order)
    parent_new = torch.where(parent_union >= 0,
                             new_index.gather(1, parent_union.clamp(min=0)), 0)
    pad = want - take
    tree_tokens = torch.cat([root[:, None], tokens.gather(1, order)], dim=1)
    tree_parents = torch.cat([torch.full((b, 1), -1, device=device), parent_new], dim=1)
    tree_depth = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device),
                            depth.gather(1, order)], dim=1)
    tree_scores = torch.cat([torch.zeros(b, 1, device=device), scores.gather(1, order)], dim=1)
    valid = torch.ones(b, take + 1, dtype=torch.bool, device=device)
    if pad:
        tree_tokens = torch.cat([tree_tokens, tree_tokens[:, :1].expand(b, pad)], dim=1)
        tree_parents = torch.cat([tree_parents, torch.zeros(b, pad, dtype=torch.long,
                                                            device=device)], dim=1)
        tree_depth = torch.cat([tree_depth, torch.ones(b, pad, dtype=torch.long,
                                                       device=device)], dim=1)
        tree_scores = torch.cat([tree_scores, torch.full((b, pad), float("-inf"),
                                                         device=device)], dim=1)
        valid = torch.cat([valid, torch.zeros(b, pad, dtype=torch.bool, device=device)], dim=1)
    return DraftTree(tree_tokens, tree_parents, tree_depth, valid, tree_scores,
                     levels=len(level_scores) + 1)


def share_budget(tree: DraftTree, total: int, active: torch.Tensor | None = None
                 ) -> DraftTree:
    """The same trees with only ``total`` nodes kept over all requests: every root, then the
    best drafted nodes by path score across requests (one best-first selection over every
    request's candidates, the shared node budget of batched speculative decoding); the others
    become padding. A child scores below its parent, so what is kept is a set of trees. The
    layout keeps its [B, N] shape (a verify step still computes every row). ``active`` [B]:
    rows without a request keep only their root."""
    if tree.scores is None:
        raise ValueError("a shared node budget ranks nodes by their drafter scores; this tree "
                         "has none (a best-first tree has)")
    b, n = tree.tokens.shape
    if not b <= total <= b * n:
        raise ValueError(f"a shared budget of {total} nodes for {b} requests of {n} nodes "
                         f"(at least one a request, at most {b * n})")
    usable = tree.valid if active is None else tree.valid & active[:, None]
    key = torch.where(usable, tree.scores - _DEPTH_TIE * tree.depth, float("-inf"))
    key = torch.where(tree.parents < 0, float("inf"), key).flatten()  # roots always kept
    kept = torch.zeros(b * n, dtype=torch.bool, device=key.device)
    kept[key.topk(total).indices] = True
    valid = tree.valid & kept.view(b, n)
    return DraftTree(tree.tokens, tree.parents, tree.depth, valid, tree.scores, tree.levels)


def limit_rows(tree: DraftTree, widths: torch.Tensor) -> DraftTree:
    """The same trees with at most ``widths[b]`` nodes kept in request ``b`` (root included):
    the best drafted nodes by path score where the tree has scores, else the first ones in
    index order (a topological order, so either way what is kept is a tree); the others
    become padding. Per-request draft sizes in a batch: fixed [B, N] shapes, no host work."""
    b, n = tree.tokens.shape
    nodes = torch.arange(n, device=tree.tokens.device).expand(b, n)
    if tree.scores is None:
        keep = nodes < widths[:, None]
    else:
        key = torch.where(tree.valid, tree.scores - _DEPTH_TIE * tree.depth, float("-inf"))
        key = torch.where(tree.parents < 0, float("inf"), key)
        rank = key.argsort(dim=1, descending=True, stable=True).argsort(dim=1)
        keep = rank < widths[:, None]
    return DraftTree(tree.tokens, tree.parents, tree.depth, tree.valid & keep, tree.scores,
                     tree.levels)


def best_first_reference(top_tokens: list[list[int]], top_logp: list[list[float]],
                         budget: int) -> list[tuple[int, ...]]:
    """The heap search for one request: the drafted nodes (as token paths) in pop order."""
    depth_max, k = len(top_tokens), len(top_tokens[0])

    def entry(ranks: tuple[int, ...]):
        score = sum(top_logp[i][r] for i, r in enumerate(ranks))
        return (-(score - _DEPTH_TIE * len(ranks)), ranks)

    out: list[tuple[int, ...]] = []
    heap = [entry((0,))]
    while heap and len(out) < budget - 1:
        _, ranks = heapq.heappop(heap)
        out.append(tuple(top_tokens[i][r] for i, r in enumerate(ranks)))
        if ranks[-1] + 1 < k:  # next sibling
            heapq.heappush(heap, entry(ranks[:-1] + (ranks[-1] + 1,)))
        if len(ranks) < depth_max:  # first child
            heapq.heappush(heap, entry(ranks + (0,)))
    return out
