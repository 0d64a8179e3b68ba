"""Two-level verification: a cheap Q pass steers what one exact pass verifies.

One step, per request:

1. the drafter proposes a tree T1 of ``q_budget`` nodes from the committed state;
2. the **Q pass** runs T1 through the *view model* (the target with every linear on the 8-bit
   view of its W12 weights, ``w12_kernels.view8``) against the exact committed cache, and walks
   T1 along the view model's own picks: the path the target would most likely accept, and the
   view model's bonus token at its end;
3. the drafter proposes a second tree T2 rooted at that bonus token, as if the Q path were
   committed (``Drafter.propose_after``), and T2 is grafted under the Q path's last node;
4. one exact pass verifies the combined tree (``budget`` nodes) and decides every token
   (``verify.verify``).

The Q pass only chooses which tokens get verified, so the output is plain decoding's, token for
token, whatever the view model picks: the exactness argument of ``verify`` is untouched. The
Q pass writes its keys and values at the scratch slots the exact pass overwrites before reading
them (every layer writes all of a tree's rows before its attention reads any).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cache import KVCache
from engine.model import Transformer
from engine.sampling import Sampling
from engine.speculative.drafters import Drafter
from engine.speculative.tree import DraftTree
from engine.speculative.verify import Verdict, accept, forced_picks, target_picks, verify
from w12.errors import W12Error


@dataclass
class TwoLevel:
    """The Q pass's model (same architecture and cache layout as the target) and its tree's
    node budget (the rest of the step's budget goes to the re-drafted subtree)."""

    view_model: Transformer
    q_budget: int


def graft(t1: DraftTree, last: torch.Tensor, t2: DraftTree) -> DraftTree:
    """T1 with T2 hung under node ``last`` [B] of T1: T2's root becomes a child of ``last``,
    its other nodes follow with their parents shifted past T1's nodes."""
    n1 = t1.size
    parents2 = torch.where(t2.parents < 0, last[:, None], t2.parents + n1)
    depth2 = t2.depth + t1.depth.gather(1, last[:, None]) + 1
    return DraftTree(torch.cat([t1.tokens, t2.tokens], 1), torch.cat([t1.parents, parents2], 1),
                     torch.cat([t1.depth, depth2], 1), torch.cat([t1.valid, t2.valid], 1))


def q_pass(view_model: Transformer, cache: KVCache, tree: DraftTree, sampling: Sampling,
           requests: torch.Tensor, forced_accept: int | None = None) -> Verdict:
    """The view model's verdict on ``tree`` (nothing committed, the cache's lengths kept).
    ``forced_accept``: its path is the first ``forced_accept`` nodes of the tree's first-child
    chain whatever the view model picks (timing, as ``verify``'s)."""
    paths = tree.paths()
    picks = target_picks(view_model, cache, tree, paths, sampling, requests)
    if forced_accept is None:
        return accept(tree, picks, paths)
    verdict = accept(tree, forced_picks(tree, forced_accept), paths)
    # a forced walk has no bonus (-1): the view model's own pick at its end, which the
    # re-draft takes as its root
    bonus = picks.gather(1, verdict.path.gather(1, verdict.accepted[:, None]))
    steps = torch.arange(tree.size, device=picks.device)
    verdict.emitted = torch.where(steps == verdict.accepted[:, None], bonus, verdict.emitted)
    return verdict


def two_level_step(model: Transformer, cache: KVCache, drafter: Drafter, roots: torch.Tensor,
                   setting: TwoLevel, budget: int, tree: bool, sampling: Sampling,
                   requests: torch.Tensor, head=None, forced_accept: int | None = None
                   ) -> tuple[Verdict, Verdict]:
    """One two-level step: (the exact verdict, committed as ``verify`` does; the Q verdict).
    ``head``: the exact pass's certified INT8 head (``verify``). ``forced_accept`` K (timing
    on random weights): the Q path is K nodes of T1's first-child chain where T1 is that deep,
    and the exact pass accepts K along the combined tree's first-child chain (the Q path, then
    T2 where T1's chain ends): every pass and the re-draft run at their real sizes."""
    if not 1 <= setting.q_budget < budget:
        raise W12Error(f"two-level verification: the Q tree's budget {setting.q_budget} must "
                       f"be at least 1 and below the step's budget {budget}")
    t1 = drafter.propose(roots, cache, setting.q_budget, tree)
    q = q_pass(setting.view_model, cache, t1, sampling, requests, forced_accept)
    counts = q.accepted + 1  # the Q path's drafted tokens and its bonus
    last = q.path.gather(1, q.accepted[:, None])[:, 0]
    t2 = drafter.propose_after(roots, q.emitted, counts, cache, budget - t1.size, tree, q.path)
    return verify(model, cache, graft(t1, last, t2), sampling, requests, forced_accept,
                  head=head), q
