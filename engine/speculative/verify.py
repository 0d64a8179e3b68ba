"""Verification: one target forward over every node of a draft tree, then acceptance.

The target runs all N nodes at once: node n at position L + depth(n), its key and value written
at slot L + n, attending to the committed prefix and to its own path (``AttentionPlan.tree``).
At every node the target picks the token it would emit next (``engine.sampling.choose``, keyed
by the position that token takes, L + depth(n) + 1). The walk starts at the root, follows the
child whose token equals the target's pick at its parent, and stops where no child matches;
the target's pick at the last node reached is the bonus token. Every step commits the accepted
drafted tokens plus the bonus (at least one token: the root's pick is plain decoding's token).

Because each row of the forward has the bits a plain decode step would give it (batch-invariant
W12 GEMMs, tree attention with the decode step's reduction order, row-wise norms), every pick
equals plain decoding's pick at that position, greedy or sampled: the output is plain
decoding's, token for token. Nothing here waits for the host, so the whole step can be captured
in a CUDA graph per node budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionPlan
from engine.cache import KVCache
from engine.model import Transformer
from engine.sampling import Sampling, choose
from engine.speculative.tree import DraftTree


@dataclass
class Verdict:
    """What one verify step decided, per request (device tensors)."""

    accepted: torch.Tensor  # [B] drafted tokens accepted (the tokens committed are this + 1)
    path: torch.Tensor  # [B, N] node indices from the root to the last accepted node, then -1
    emitted: torch.Tensor  # [B, N] the committed tokens: accepted drafts then the bonus, then -1
    logits: torch.Tensor | None = None  # [B, N, V] fp32, the target's logits at every node


def accept(tree: DraftTree, picks: torch.Tensor, paths: torch.Tensor) -> Verdict:
    """Walk each tree along the target's picks [B, N] (``paths`` = ``tree.paths()``)."""
    b, n = tree.tokens.shape
    parent_pick = picks.gather(1, tree.parents.clamp(min=0))
    match = tree.valid & ((tree.tokens == parent_pick) | (tree.parents < 0))
    on_path = match.gather(1, paths.clamp(min=0).view(b, -1)).view(b, n, n) | (paths < 0)
    reached = on_path.all(dim=-1)  # every node of the path matched
    # the deepest reached node (siblings hold distinct tokens: one per depth), lowest index
    rank = torch.where(reached, tree.depth * n + (n - 1 - torch.arange(n, device=picks.device)),
                       -1)
    last = rank.argmax(dim=1)
    accepted = tree.depth.gather(1, last[:, None])[:, 0]
    path = paths.gather(1, last[:, None, None].expand(b, 1, n))[:, 0]
    drafted = tree.tokens.gather(1, path.clamp(min=0))
    steps = torch.arange(n, device=picks.device)
    bonus = picks.gather(1, last[:, None])
    # emitted[i] = drafted token at depth i + 1 for i < accepted, the bonus at i = accepted
    shifted = torch.cat([drafted[:, 1:], drafted[:, :1]], dim=1)
    emitted = torch.where(steps < accepted[:, None], shifted,
                          torch.where(steps == accepted[:, None], bonus, -1))
    return Verdict(accepted, path, emitted)


def forced_picks(tree: DraftTree, accept_count: int) -> torch.Tensor:
    """Picks [B, N] that accept exactly the first ``accept_count`` nodes of each tree's
    first-child chain (fewer where the tree is shallower): the timing of a verify step at a
    fixed acceptance, for models whose own picks mean nothing (random weights)."""
    b, n = tree.tokens.shape
    nodes = torch.arange(n, device=tree.tokens.device).expand(b, n)
    child_of = torch.where(tree.valid & (tree.parents >= 0), tree.parents, n)
    first_child = torch.full((b, n + 1), n, dtype=torch.long, device=tree.tokens.device)
    first_child.scatter_reduce_(1, child_of, nodes, reduce="amin")
    first_child = first_child[:, :n]
    child_token = tree.tokens.gather(1, first_child.clamp(max=n - 1))
    go_on = (first_child < n) & (tree.depth < accept_count)
    return torch.where(go_on, child_token, -1)


def target_logits(model: Transformer, cache: KVCache, tree: DraftTree, paths: torch.Tensor,
                  sampling: Sampling, requests: torch.Tensor):
    """([B, N, V] logits, [B, N] picks) of ``model`` at every node of ``tree`` (``paths`` = its
    paths), each pick keyed by the position its token takes; every node's key and value
    written."""
    lengths = cache.lengths
    pos = lengths[:, None] + tree.depth
    logits = model(tree.tokens, pos, cache, AttentionPlan.tree(lengths, paths, tree.levels))
    b, n, vocab = logits.shape
    return logits, choose(logits.view(b * n, vocab), sampling, requests.repeat_interleave(n),
                          (pos + 1).view(-1)).view(b, n)


def target_picks(model: Transformer, cache: KVCache, tree: DraftTree, paths: torch.Tensor,
                 sampling: Sampling, requests: torch.Tensor) -> torch.Tensor:
    """[B, N] the token ``model`` picks at every node of ``tree`` (``target_logits``)."""
    return target_logits(model, cache, tree, paths, sampling, requests)[1]


@dataclass
class Pending:
    """A verify step's forward pass whose picks are still to be made (a head that runs apart,
    ``engine.head``): the tree, its paths, the head's input [B, N, dim] at every node and each
    node's position [B, N]."""

    tree: DraftTree
    paths: torch.Tensor
    hidden: torch.Tensor
    pos: torch.Tensor


def verify_forward(model: Transformer, cache: KVCache, tree: DraftTree) -> Pending:
    """The target over every node of ``tree`` up to the LM head's input (keys and values
    written, nothing accepted or committed)."""
    lengths = cache.lengths
    paths = tree.paths()
    pos = lengths[:, None] + tree.depth
    plan = AttentionPlan.tree(lengths, paths, tree.levels)
    hidden = model(tree.tokens, pos, cache, plan, head=False)
    return Pending(tree, paths, hidden, pos)


def head_picks(head, pending: Pending, sampling: Sampling, requests: torch.Tensor
               ) -> torch.Tensor:
    """[B, N] the picks of ``head`` (``engine.head.CertifiedHead``) at every node, each keyed
    by the position its token takes."""
    b, n, width = pending.hidden.shape
    return head.choose(pending.hidden.reshape(b * n, width), sampling,
                       requests.repeat_interleave(n), (pending.pos + 1).view(-1)).view(b, n)


def verify_finish(cache: KVCache, tree: DraftTree, paths: torch.Tensor, picks: torch.Tensor,
                  forced_accept: int | None = None) -> Verdict:
    """Accept ``tree`` (``paths`` = its paths) along ``picks`` [B, N], move the accepted rows
    into place, commit (the second half of ``verify``)."""
    if forced_accept is not None:
        picks = forced_picks(tree, forced_accept)  # the target's picks ran all the same
    verdict = accept(tree, picks, paths)
    committed = verdict.accepted + 1
    lengths = cache.lengths
    cache.keep(torch.where(verdict.path >= 0, verdict.path + lengths[:, None], -1), committed)
    cache.commit(committed)
    return verdict


def verify(model: Transformer, cache: KVCache, tree: DraftTree, sampling: Sampling,
           requests: torch.Tensor, forced_accept: int | None = None, head=None) -> Verdict:
    """Run ``tree`` through the target, accept, move the accepted rows into place and advance
    every request's length by the tokens it commits. ``forced_accept``: accept that many
    drafted tokens whatever the target picks (timing, and token forcing, which reads the
    verdict's logits along a given path; see ``forced_picks``). ``head``: the certified INT8
    head picks (``verify_forward``, ``head_picks``, ``verify_finish``; the verdict then has no
    logits)."""
    if head is not None:
        pending = verify_forward(model, cache, tree)
        return verify_finish(cache, tree, pending.paths,
                             head_picks(head, pending, sampling, requests), forced_accept)
    paths = tree.paths()
    logits, picks = target_logits(model, cache, tree, paths, sampling, requests)
    verdict = verify_finish(cache, tree, paths, picks, forced_accept)
    verdict.logits = logits
    return verdict
