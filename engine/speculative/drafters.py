"""Drafters: what proposes the tokens a verify step checks.

Every drafter answers one question per step: given each request's root (the last committed
token, at position ``cache.lengths``) and a node budget, which tree to verify
(``propose``). It also hears which tokens each request committed (``observe``), and is told
when new prompts start (``start``). Two need no training:

- ``NgramDrafter`` (prompt lookup): the tokens that followed the most recent earlier
  occurrence of the request's last n tokens (n from ``max_ngram`` down to 1), in the prompt or
  the output so far; a chain, or in tree mode a trie of the continuations of several matches.
- ``EarlyExitDrafter`` (self-speculation): the target's own first K layers, final norm and LM
  head, run autoregressively for the tree's depth; its per-position top-k feeds the best-first
  builder (or its top-1 chain). It writes its keys and values into the target's cache at the
  slots the verify step overwrites next, so the committed prefix of its K layers is the
  target's own and needs no catching up.

The trained one, the block drafter, lives in ``block_drafter.py``. ``LookupGraft``
(``NAME+ngram``) grafts prompt lookup's continuation onto a device drafter's tree.
``RandomDrafter`` is for timing only: pseudo-random tokens filling the whole budget every step,
so that verify with forced acceptance (``bench spec --forced-accept``) checks full trees on
models whose drafts mean nothing (synthetic weights, hybrids where early exit is refused).

``make_drafter("ngram" | "early-exit:K" | "random" | "demo" | FOLDER, model)`` builds one from
its command-line name (``demo``: the block drafter shipped for the demo model; a folder: a block
drafter folder).
"""

from __future__ import annotations

import math

import torch

from engine.attention import AttentionPlan
from engine.cache import KVCache
from engine.model import Transformer
from engine.speculative.tree import DraftTree, best_first
from w12.errors import W12Error

DRAFTER_NAMES = ("ngram", "early-exit:K", "random", "demo", "a block drafter folder",
                 "any of the last three + ngram")
TREE_TOP_K = 8  # candidates per position for best-first trees
MAX_TREE_DEPTH = 16  # deepest level a best-first tree explores


class Drafter:
    """The protocol (the base does nothing: subclasses override what they need).

    ``on_device``: ``propose`` is device work only (no host reads, fixed shapes), so the
    runner captures it in one CUDA graph with the verify step; a host drafter's tree is copied
    into the graph's input buffers instead."""

    name = "drafter"
    on_device = False

    def bind(self, cache: KVCache) -> None:
        """The target's cache this drafter drafts for, before its first prefill (a drafter
        that reads the target's hidden states asks the cache to keep them here)."""

    def start(self, prompts: list[list[int]], first: list[int]) -> None:
        """New requests: their prompts and first tokens (the roots of the first step)."""

    def admit(self, row: int, prompt: list[int], first: int) -> None:
        """A new request in ``row`` (the others go on): its prompt, already in the target's
        cache, and its first token. Continuous batching calls this instead of ``start``."""
        raise W12Error(f"drafter {self.name} cannot take a request into a running batch")

    def observe(self, committed: list[list[int]]) -> None:
        """The tokens each request committed in the last step (accepted drafts + bonus)."""

    def propose(self, roots: torch.Tensor, cache: KVCache, budget: int, tree: bool
                ) -> DraftTree:
        raise NotImplementedError

    def propose_after(self, roots: torch.Tensor, context: torch.Tensor, counts: torch.Tensor,
                      cache: KVCache, budget: int, tree: bool, path: torch.Tensor) -> DraftTree:
        """A tree rooted at each request's token ``context[b, counts[b] - 1]``, drafted as if
        the root and the first ``counts[b]`` tokens of ``context`` [B, C] were committed (the
        cache's lengths are the same on return): two-level verification's re-draft. ``path``
        [B, N]: the tree nodes of the root and those tokens (the Q pass's path, then -1),
        whose rows the Q pass wrote at slots ``lengths + node``."""
        raise W12Error(f"drafter {self.name} cannot draft after an uncommitted path, which "
                       "two-level verification needs")


class NgramDrafter(Drafter):
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, matches: int = 4) -> None:
        self.name = "ngram"
        self.max_ngram, self.min_ngram, self.matches = max_ngram, min_ngram, matches
        self.history: list[list[int]] = []

    def start(self, prompts: list[list[int]], first: list[int]) -> None:
        self.history = [list(p) + [t] for p, t in zip(prompts, first, strict=True)]

    def bind(self, cache: KVCache) -> None:
        self.history = [[] for _ in range(cache.batch)]  # an empty row drafts nothing

    def admit(self, row: int, prompt: list[int], first: int) -> None:
        self.history[row] = list(prompt) + [first]

    def observe(self, committed: list[list[int]]) -> None:
        for row, tokens in enumerate(committed):
            self.history[row].extend(tokens)

    def continuations(self, seq: list[int], length: int, limit: int) -> list[list[int]]:
        """Up to ``limit`` distinct continuations of ``length`` tokens after earlier
        occurrences of ``seq``'s last n tokens, longest n and most recent match first."""
        found: list[list[int]] = []
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start:start + n] == tail:
                    cont = seq[start + n:start + n + length]
                    if cont and cont not in found:
                        found.append(cont)
                        if len(found) == limit:
                            return found
        return found

    def propose(self, roots, cache, budget, tree):
        rows = [self._row(seq, budget, tree) for seq in self.history]
        return _tree_from_rows(roots, rows, budget)

    def propose_after(self, roots, context, counts, cache, budget, tree, path):
        rows, new_roots = [], []
        for seq, tokens, count in zip(self.history, context.tolist(), counts.tolist(),
                                      strict=True):
            rows.append(self._row(seq + tokens[:count], budget, tree))
            new_roots.append(tokens[count - 1])
        return _tree_from_rows(torch.tensor(new_roots, device=roots.device), rows, budget)

    def _row(self, seq: list[int], budget: int, tree: bool) -> list[tuple[int, int]]:
        """(token, parent) of the drafted nodes, parents as node indices (root = 0)."""
        conts = self.continuations(seq, budget - 1, self.matches if tree else 1)
        nodes: list[tuple[int, int]] = []
        children: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for cont in conts:
            parent = 0
            for token in cont:
                if (parent, token) not in children:
                    if len(nodes) == budget - 1:
                        break
                    nodes.append((token, parent))
                    children[(parent, token)] = len(nodes)
                parent = children[(parent, token)]
        return nodes


class LookupGraft(Drafter):
    """``NAME+ngram``: a device drafter's tree with prompt lookup's continuation grafted on,
    under the one budget. A tree takes the lookup's continuation first (at most ``share`` of
    the drafted nodes), then the drafter's nodes best score first, a node only after its
    parent, a (parent, token) pair once; a chain is the lookup's continuation where the
    history has a match, else the drafter's chain. Acceptance does not depend on who drafted
    a node, so the outputs stay plain decoding's; the merge reads the tree on the host, so the
    step is not captured with the verify (as with ``ngram``)."""

    def __init__(self, main: Drafter, *, share: float = 0.5) -> None:
        if not main.on_device:
            raise W12Error(f"drafter {main.name}+ngram: prompt lookup grafts onto a device "
                           "drafter (early-exit:K, demo or a block drafter folder)")
        self.main, self.lookup, self.share = main, NgramDrafter(), share
        self.name = f"{main.name}+ngram"

    def bind(self, cache: KVCache) -> None:
        self.main.bind(cache)
        self.lookup.bind(cache)

    def start(self, prompts: list[list[int]], first: list[int]) -> None:
        self.main.start(prompts, first)
        self.lookup.start(prompts, first)

    def admit(self, row: int, prompt: list[int], first: int) -> None:
        self.main.admit(row, prompt, first)
        self.lookup.admit(row, prompt, first)

    def observe(self, committed: list[list[int]]) -> None:
        self.main.observe(committed)
        self.lookup.observe(committed)

    def propose(self, roots, cache, budget, tree):
        drafted = self.main.propose(roots, cache, budget, tree)
        tokens, parents, valid = (t.cpu() for t in (drafted.tokens, drafted.parents,
                                                    drafted.valid))
        scores = None if drafted.scores is None else drafted.scores.float().cpu()
        depth = drafted.depth.cpu()
        cap = int((budget - 1) * self.share) if tree else budget - 1
        rows = []
        for b, seq in enumerate(self.lookup.history):
            found = self.lookup.continuations(seq, cap, 1) if cap > 0 else []
            if not tree:
                chain = found[0] if found else tokens[b, 1:][valid[b, 1:]].tolist()
                rows.append([(t, i) for i, t in enumerate(chain)])
                continue
            rows.append(_graft(found[0] if found else [], tokens[b], parents[b], valid[b],
                               depth[b], None if scores is None else scores[b], budget))
        return _tree_from_rows(roots, rows, budget)


def _graft(chain: list[int], tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor,
           depth: torch.Tensor, scores: torch.Tensor | None, budget: int
           ) -> list[tuple[int, int]]:
    """(token, parent) nodes of one request: ``chain`` from the root, then the tree's valid
    nodes best score first (shallower first on ties, so a parent precedes its children;
    the tree's order without scores), each once per (parent, token), ``budget - 1`` at most."""
    nodes: list[tuple[int, int]] = []
    index: dict[tuple[int, int], int] = {}

    def add(token: int, parent: int) -> int | None:
        if (parent, token) not in index:
            if len(nodes) == budget - 1:
                return None
            nodes.append((token, parent))
            index[(parent, token)] = len(nodes)
        return index[(parent, token)]

    at: int | None = 0
    for token in chain:
        at = add(token, at)
        if at is None:
            break
    order = [n for n in range(1, tokens.shape[0]) if valid[n]]
    if scores is not None:
        order.sort(key=lambda n: (-float(scores[n]), int(depth[n])))
    where = {0: 0}  # the tree's node -> its node here
    for n in order:
        parent = where.get(int(parents[n]))
        if parent is None:
            continue
        node = add(int(tokens[n]), parent)
        if node is None:
            break
        where[n] = node
    return nodes


def _tree_from_rows(roots: torch.Tensor, rows: list[list[tuple[int, int]]], budget: int
                    ) -> DraftTree:
    """A padded tree of ``budget`` nodes per request from host (token, parent) lists."""
    b = len(rows)
    tokens = torch.zeros(b, budget, dtype=torch.long)
    parents = torch.zeros(b, budget, dtype=torch.long)
    depth = torch.ones(b, budget, dtype=torch.long)
    valid = torch.zeros(b, budget, dtype=torch.bool)
    parents[:, 0], depth[:, 0], valid[:, 0] = -1, 0, True
    for row, nodes in enumerate(rows):
        for i, (token, parent) in enumerate(nodes, start=1):
            tokens[row, i], parents[row, i], valid[row, i] = token, parent, True
            depth[row, i] = depth[row, parent] + 1
    device = roots.device
    tokens = tokens.to(device)
    tokens[:, 0] = roots
    return DraftTree(tokens, parents.to(device), depth.to(device), valid.to(device),
                     levels=int(depth.max()) + 1)  # (host tensors: no read-back)


class EarlyExitDrafter(Drafter):
    on_device = True

    def __init__(self, model: Transformer, layers: int, top_k: int = TREE_TOP_K,
                 max_depth: int = MAX_TREE_DEPTH) -> None:
        if not 1 <= layers < model.args.n_layers:
            raise W12Error(f"early-exit:{layers}: the target has {model.args.n_layers} layers; "
                           f"K must be 1..{model.args.n_layers - 1}")
        if model.args.gdn_layers:
            raise W12Error(f"early-exit:{layers} drafts through the target's own cache, and a "
                           "hybrid's GDN layers would advance their state on its drafts; use "
                           "ngram or a block drafter")
        self.name = f"early-exit:{layers}"
        self.model, self.layers, self.top_k, self.max_depth = model, layers, top_k, max_depth

    def admit(self, row, prompt, first):
        """Nothing to do: its K layers' keys and values are the target's, from the prefill."""

    @torch.inference_mode()
    def propose(self, roots, cache, budget, tree):
        depth = budget - 1 if not tree else min(budget - 1, self.max_depth)
        k = 1 if not tree else min(self.top_k, budget - 1)
        if depth == 0:
            return DraftTree.chain(roots, roots[:, None][:, :0])
        top_tokens, top_logp = self.draft(roots, cache, depth, k)
        if not tree:
            return DraftTree.chain(roots, top_tokens[:, :, 0])
        return best_first(roots, top_tokens, top_logp, budget)

    @torch.inference_mode()
    def propose_after(self, roots, context, counts, cache, budget, tree, path):
        # the K layers' keys and values of the root and the path at its positions (slots the
        # exact pass overwrites), then a draft from the path's last token
        lengths = cache.lengths.clone()
        chain = torch.cat([roots[:, None], context[:, :-1].clamp(min=0)], dim=1)
        steps = torch.arange(chain.shape[1], device=roots.device)
        self.model(chain, lengths[:, None] + steps, cache,
                   AttentionPlan.chain(lengths, chain.shape[1]), n_layers=self.layers)
        cache.lengths.copy_(lengths + counts)
        try:
            return self.propose(context.gather(1, (counts - 1)[:, None])[:, 0], cache, budget,
                                tree)
        finally:
            cache.lengths.copy_(lengths)

    def draft(self, roots: torch.Tensor, cache: KVCache, depth: int, k: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, depth, k] top tokens and log-probabilities along the drafter's greedy chain."""
        tokens, logps = [], []
        token = roots
        for d in range(depth):
            lengths = cache.lengths + d
            logits = self.model(token[:, None], lengths[:, None], cache,
                                AttentionPlan.decode(lengths), n_layers=self.layers)[:, 0]
            logp, top = logits.log_softmax(dim=-1).topk(k, dim=-1)
            tokens.append(top)
            logps.append(logp)
            token = top[:, 0]
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)


class RandomDrafter(Drafter):
    """Pseudo-random drafts for timing: a chain of ``budget - 1`` tokens, or a best-first tree
    over ``TREE_TOP_K`` candidates a level with made-up scores, hashed on the device from each
    root and a step counter (no host reads, no random state: graph-capturable and the same
    every run). Its drafts are never right; pair it with forced acceptance."""

    name = "random"
    on_device = True

    def __init__(self, model: Transformer) -> None:
        self.vocab = model.args.vocab_size
        self.step = torch.zeros((), dtype=torch.long, device=model.device)

    def admit(self, row, prompt, first):
        """Nothing to do."""

    def _hash(self, roots: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        index = torch.arange(math.prod(shape), device=roots.device).view(shape)
        x = roots.view(-1, *([1] * len(shape))) * 1_000_003 + index * 7919 + self.step * 104_729
        return (x * 2_654_435_761) % 4_294_967_291

    @torch.inference_mode()
    def propose(self, roots, cache, budget, tree):
        self.step += 1
        b = roots.shape[0]
        if not tree or budget <= 2:
            return DraftTree.chain(roots, self._hash(roots, (budget - 1,)) % self.vocab)
        depth, k = min(budget - 1, MAX_TREE_DEPTH), min(TREE_TOP_K, budget - 1)
        noise = self._hash(roots, (depth, k))
        tokens = (noise % self.vocab).view(b, depth, k)
        # distinct candidates a level: token j of a level is offset by j (mod vocab)
        tokens = (tokens[..., :1] + torch.arange(k, device=roots.device)) % self.vocab
        logp = -(noise % 1000).float().view(b, depth, k) / 100 - 1
        return best_first(roots, tokens, logp.sort(dim=-1, descending=True).values, budget)


def make_drafter(name: str, model: Transformer) -> Drafter:
    """A drafter from its command-line name: ``ngram``, ``early-exit:K``, ``demo`` or the folder
    of a block drafter; ``NAME+ngram`` grafts prompt lookup onto drafter NAME."""
    if name.endswith("+ngram"):
        return LookupGraft(make_drafter(name[:-len("+ngram")], model))
    if name == "ngram":
        return NgramDrafter()
    if name == "random":
        return RandomDrafter(model)
    if name.startswith("early-exit:"):
        layers = name.split(":", 1)[1]
        if not layers.isdigit():
            raise W12Error(f"drafter {name!r}: K must be a number of layers, e.g. early-exit:4")
        return EarlyExitDrafter(model, int(layers))
    from engine.speculative.block_drafter import BlockDrafter, resolve_drafter_folder

    folder = resolve_drafter_folder(name)
    if folder is not None:
        return BlockDrafter.load(folder, model, name=name)
    raise W12Error(f"unknown drafter {name!r} (known: {', '.join(DRAFTER_NAMES)})")
