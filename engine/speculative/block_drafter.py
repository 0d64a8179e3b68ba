"""The block drafter: a few layers that propose a whole block of tokens in one forward.

The drafter conditions on the target's own hidden states. The target's cache keeps the
residual stream after a few evenly spaced layers per slot (``KVCache.tap``); the drafter
concatenates them per position, fuses them with a linear layer and an RMSNorm, and every
drafter layer projects the fused states with its own key/value projection: those are the
*context* entries of its attention, positions 0 .. L - 1 of a request. The block is the root
(the last committed token, position L) followed by ``block_size - 1`` mask positions (a
learned mask embedding); its queries see every context entry and every block position
(non-causal inside the block). After the drafter's final norm the target's LM head (shared,
frozen, the target's embedding too) gives every mask position's distribution at once: the
top-1 of each is the chain, their top-k feed the best-first tree builder.

The drafter's own cache (a ``KVCache`` with one layer per drafter layer) holds context entries
only. Each ``propose`` first turns the positions the last verify step committed (read from the
target's taps, which ``keep`` moved into place with the keys and values) into context entries,
then sets its lengths to the target's committed lengths: the cache is cropped to the committed
length every round, and the block itself is never stored. All of it is device work with fixed
shapes (``on_device``), captured with the verify step in one CUDA graph.

A drafter is a folder like any model: ``config.json`` (architecture ``W12BlockDrafter``, the
target's width and vocabulary, the tapped layers, the block size) and safetensors, BF16 or W12.
Its linear layers run on the target's op path (W12 GEMM when the target runs W12).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.cache import KVCache
from engine.model import Linear, ModelArgs, Transformer, rope_tables
from engine.ops import rope, swiglu
from engine.speculative.drafters import MAX_TREE_DEPTH, TREE_TOP_K, Drafter
from engine.speculative.tree import DraftTree, best_first
from engine.w12_backend import cat_rows, prepare
from w12.errors import W12Error
from w12.tensor import W12Tensor, encode

ARCHITECTURE = "W12BlockDrafter"
DEMO_DRAFTER = Path(__file__).parent / "shipped" / "smollm2-135m-instruct"


def tap_layers(n_layers: int, count: int) -> tuple[int, ...]:
    """``count`` evenly spaced layers of a target of ``n_layers`` (from layer 1 to the third
    last where the target is deep enough, else any layer), without repeats."""
    lo, hi = (1, n_layers - 3) if n_layers >= count + 3 else (0, n_layers - 1)
    if count == 1:
        return (hi,)
    return tuple(sorted({round(lo + (hi - lo) * i / (count - 1)) for i in range(count)}))


@dataclass
class BlockDrafterConfig:
    vocab_size: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    qk_norm: bool
    target_layers: tuple[int, ...]
    target_n_layers: int
    n_layers: int = 3
    block_size: int = 16

    @classmethod
    def for_target(cls, args: ModelArgs, *, n_layers: int = 3, block_size: int = 16,
                   taps: int = 5) -> BlockDrafterConfig:
        if not 2 <= block_size <= 64:
            raise W12Error(f"block size {block_size}: must be 2..64")
        if n_layers < 1 or taps < 1:
            raise W12Error(f"a block drafter needs at least one layer and one tapped layer, "
                           f"got {n_layers} and {taps}")
        return cls(args.vocab_size, args.dim, args.n_heads, args.n_kv_heads, args.head_dim,
                   args.intermediate_size, args.norm_eps, args.rope_theta, args.rope_scaling,
                   args.qk_norm, tap_layers(args.n_layers, taps), args.n_layers, n_layers,
                   block_size)

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def rope_args(self) -> ModelArgs:
        return ModelArgs(head_dim=self.head_dim, rope_theta=self.rope_theta,
                         rope_scaling=self.rope_scaling)

    def to_hf(self) -> dict:
        return {
            "architectures": [ARCHITECTURE], "model_type": "w12_block_drafter",
            "vocab_size": self.vocab_size, "hidden_size": self.dim,
            "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling, "qk_norm": self.qk_norm,
            "num_hidden_layers": self.n_layers, "block_size": self.block_size,
            "target_layer_ids": list(self.target_layers),
            "target_num_hidden_layers": self.target_n_layers, "torch_dtype": "bfloat16",
        }

    @classmethod
    def from_hf(cls, cfg: dict, where: str) -> BlockDrafterConfig:
        if cfg.get("architectures") != [ARCHITECTURE]:
            raise W12Error(f"{where}: not a block drafter (architectures "
                           f"{cfg.get('architectures')!r}, expected [{ARCHITECTURE!r}])")
        try:
            return cls(
                int(cfg["vocab_size"]), int(cfg["hidden_size"]), int(cfg["num_attention_heads"]),
                int(cfg["num_key_value_heads"]), int(cfg["head_dim"]),
                int(cfg["intermediate_size"]), float(cfg["rms_norm_eps"]),
                float(cfg["rope_theta"]), cfg.get("rope_scaling"), bool(cfg["qk_norm"]),
                tuple(int(i) for i in cfg["target_layer_ids"]),
                int(cfg["target_num_hidden_layers"]), int(cfg["num_hidden_layers"]),
                int(cfg["block_size"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise W12Error(f"{where}: bad or missing block drafter field ({exc})") from exc

    def check_target(self, args: ModelArgs, where: str) -> None:
        """A clear error when this drafter was made for a target of another shape."""
        mine = (self.vocab_size, self.dim, self.target_n_layers)
        theirs = (args.vocab_size, args.dim, args.n_layers)
        if mine != theirs:
            raise W12Error(f"{where}: this drafter is for a target of vocabulary {mine[0]}, width "
                           f"{mine[1]}, {mine[2]} layers; the model has vocabulary {theirs[0]}, "
                           f"width {theirs[1]}, {theirs[2]} layers")
        if (self.n_heads, self.n_kv_heads, self.head_dim) != (args.n_heads, args.n_kv_heads,
                                                               args.head_dim):
            raise W12Error(f"{where}: this drafter's attention shape ({self.n_heads} heads, "
                           f"{self.n_kv_heads} KV heads of {self.head_dim}) is not the model's")


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with the statistic in float32 (differentiable, for training and drafting)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class DraftLayer(nn.Module):
    """A pre-norm transformer layer whose attention also reads injected context entries."""

    def __init__(self, c: BlockDrafterConfig) -> None:
        super().__init__()
        self.c = c
        self.wq = Linear(c.dim, c.q_size)
        self.wkv = Linear(c.dim, 2 * c.kv_size)  # context states and block positions alike
        self.wo = Linear(c.q_size, c.dim)
        self.w13 = Linear(c.dim, 2 * c.intermediate_size)
        self.w2 = Linear(c.intermediate_size, c.dim)
        self.attn_norm = nn.Parameter(torch.ones(c.dim))
        self.mlp_norm = nn.Parameter(torch.ones(c.dim))
        self.q_norm = nn.Parameter(torch.ones(c.head_dim)) if c.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(c.head_dim)) if c.qk_norm else None

    def keys_values(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (RoPE applied) and values [B, T, Hkv, D] of states ``h`` [B, T, dim]."""
        b, t, _ = h.shape
        k, v = self.wkv(h).view(b, t, 2, self.c.n_kv_heads, self.c.head_dim).unbind(2)
        if self.k_norm is not None:
            k = rms(k, self.k_norm, self.c.norm_eps)
        return rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_ctx: torch.Tensor, v_ctx: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Block rows ``x`` [B, Q, dim] over context entries ``k_ctx``/``v_ctx`` [B, Hkv, S, D]
        and the block rows themselves; ``visible`` [B, Q, S + Q]."""
        c, (b, t, _) = self.c, x.shape
        h = rms(x, self.attn_norm, c.norm_eps)
        q = self.wq(h).view(b, t, c.n_heads, c.head_dim)
        if self.q_norm is not None:
            q = rms(q, self.q_norm, c.norm_eps)
        k, v = self.keys_values(h, cos, sin)
        dtype = v.dtype  # (under autocast the rotated rows come out in float32)
        keys = torch.cat([k_ctx.to(dtype), k.transpose(1, 2).to(dtype)], dim=2)
        values = torch.cat([v_ctx.to(dtype), v.transpose(1, 2)], dim=2)
        q = rope(q, cos, sin).transpose(1, 2).to(dtype)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible[:, None],
                                             enable_gqa=True)
        x = x + self.wo(out.transpose(1, 2).reshape(b, t, c.q_size))
        return x + self.w2(swiglu(self.w13(rms(x, self.mlp_norm, c.norm_eps))))


class BlockDrafterModel(nn.Module):
    """The drafter's own weights: the fusion of the tapped states, the layers, the final norm
    and the mask embedding (the embedding and LM head are the target's)."""

    def __init__(self, config: BlockDrafterConfig) -> None:
        super().__init__()
        c = self.config = config
        self.fc = Linear(len(c.target_layers) * c.dim, c.dim)
        self.context_norm = nn.Parameter(torch.ones(c.dim))
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.n_layers))
        self.norm = nn.Parameter(torch.ones(c.dim))
        self.mask_embedding = nn.Parameter(torch.zeros(c.dim))

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """Fused context states [B, T, dim] from the concatenated taps [B, T, taps * dim]."""
        return rms(self.fc(taps), self.context_norm, self.config.norm_eps)

    def block_inputs(self, root_embeddings: torch.Tensor) -> torch.Tensor:
        """[..., block, dim]: each root's embedding, then the mask embedding."""
        shape = (*root_embeddings.shape[:-1], self.config.block_size - 1, self.config.dim)
        mask = self.mask_embedding.to(root_embeddings.dtype).expand(shape)
        return torch.cat([root_embeddings.unsqueeze(-2), mask], dim=-2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                contexts: list[tuple[torch.Tensor, torch.Tensor]], visible: torch.Tensor
                ) -> torch.Tensor:
        """Final-normed states [B, Q, dim] of block rows ``x``; ``contexts`` holds each
        layer's context keys and values [B, Hkv, S, D]."""
        for layer, (k_ctx, v_ctx) in zip(self.layers, contexts, strict=True):
            x = layer(x, cos, sin, k_ctx, v_ctx, visible)
        return rms(x, self.norm, self.config.norm_eps)


# ----------------------------------------------------------------------------- folders

def tensor_names(c: BlockDrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a drafter folder with its shape (Hugging Face style names)."""
    d, q, kv, ff = c.dim, c.q_size, c.kv_size, c.intermediate_size
    shapes = {"fc.weight": (d, len(c.target_layers) * d), "context_norm.weight": (d,),
              "norm.weight": (d,), "mask_embedding": (d,)}
    for i in range(c.n_layers):
        p = f"layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                   p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                   p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
                   p + "mlp.down_proj.weight": (d, ff), p + "input_layernorm.weight": (d,),
                   p + "post_attention_layernorm.weight": (d,)}
        if c.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (c.head_dim,),
                       p + "self_attn.k_norm.weight": (c.head_dim,)}
    return shapes


def _linear_parts(net: BlockDrafterModel) -> dict[str, tuple[Linear, list[str]]]:
    parts = {"fc": (net.fc, ["fc"])}
    for i, layer in enumerate(net.layers):
        p = f"layers.{i}."
        parts |= {p + "wq": (layer.wq, [p + "self_attn.q_proj"]),
                  p + "wkv": (layer.wkv, [p + "self_attn.k_proj", p + "self_attn.v_proj"]),
                  p + "wo": (layer.wo, [p + "self_attn.o_proj"]),
                  p + "w13": (layer.w13, [p + "mlp.gate_proj", p + "mlp.up_proj"]),
                  p + "w2": (layer.w2, [p + "mlp.down_proj"])}
    return parts


def _vectors(net: BlockDrafterModel) -> dict[str, tuple[nn.Module, str]]:
    """File name -> (module, attribute) of every 1-D tensor."""
    out = {"context_norm.weight": (net, "context_norm"), "norm.weight": (net, "norm"),
           "mask_embedding": (net, "mask_embedding")}
    for i, layer in enumerate(net.layers):
        p = f"layers.{i}."
        out |= {p + "input_layernorm.weight": (layer, "attn_norm"),
                p + "post_attention_layernorm.weight": (layer, "mlp_norm")}
        if net.config.qk_norm:
            out |= {p + "self_attn.q_norm.weight": (layer, "q_norm"),
                    p + "self_attn.k_norm.weight": (layer, "k_norm")}
    return out


def state_for_folder(net: BlockDrafterModel) -> dict[str, torch.Tensor]:
    """The drafter's weights under their folder names, BF16, on the CPU."""
    out = {}
    for linear, names in _linear_parts(net).values():
        rows = [linear.out_features // len(names)] * len(names)
        for name, part in zip(names, linear.weight.detach().split(rows), strict=True):
            out[name + ".weight"] = part.to("cpu", torch.bfloat16).contiguous()
    for name, (module, attr) in _vectors(net).items():
        out[name] = getattr(module, attr).detach().to("cpu", torch.bfloat16).contiguous()
    return out


def load_drafter_model(folder: Path, target: Transformer) -> BlockDrafterModel:
    """A drafter folder (BF16 or W12) for ``target``, on its device, in its weight mode."""
    from engine.weights import FolderSource

    source = FolderSource(Path(folder))
    where = f"{folder}/config.json"
    config = BlockDrafterConfig.from_hf(source.config, where)
    config.check_target(target.args, where)
    w12 = target.layers[0].attn.wqkv.is_w12
    device, dtype = target.device, target.dtype
    shapes = tensor_names(config)

    def read(name: str):
        if not source.has(name):
            raise W12Error(f"{folder}: tensor {name} is missing")
        value = source.read(name)
        if tuple(value.shape) != shapes[name]:
            raise W12Error(f"{folder}: tensor {name} has shape {tuple(value.shape)}, the config "
                           f"implies {shapes[name]}")
        return value

    def dense(value) -> torch.Tensor:
        if isinstance(value, W12Tensor):
            return value.to(device).decode().to(dtype)
        return value.to(device=device, dtype=dtype)

    with torch.device("meta"):
        net = BlockDrafterModel(config)
    for linear, names in _linear_parts(net).values():
        values = [read(n + ".weight") for n in names]
        linear.weight = None
        if w12:
            linear.packed = prepare(cat_rows([
                v.to(device) if isinstance(v, W12Tensor)
                else encode(v.to(device=device, dtype=torch.bfloat16)) for v in values]))
        else:
            linear.weight = torch.cat([dense(v) for v in values])
    for name, (module, attr) in _vectors(net).items():
        setattr(module, attr, nn.Parameter(dense(read(name)), requires_grad=False))
    return net


# ----------------------------------------------------------------------------- drafting

class BlockDrafter(Drafter):
    """The block drafter behind the runtime's protocol (see the module docstring). ``net``
    is moved to the target's device and dtype (a network fresh from training included)."""

    on_device = True

    def __init__(self, target: Transformer, net: BlockDrafterModel, *, name: str = "block",
                 top_k: int = TREE_TOP_K) -> None:
        net = net.to(device=target.device, dtype=target.dtype).eval()
        self.target, self.net, self.name, self.top_k = target, net, name, top_k
        self.config = net.config
        self.cache: KVCache | None = None

    @classmethod
    def load(cls, folder: Path, target: Transformer, *, name: str | None = None
             ) -> BlockDrafter:
        return cls(target, load_drafter_model(folder, target), name=name or f"block:{folder}")

    def bind(self, cache: KVCache) -> None:
        c = self.config
        self.cache = cache
        self.taps = cache.tap(c.target_layers, c.dim)
        # room past the longest request for the scratch rows an ingest window writes
        self.context = KVCache(c.n_layers, cache.batch, c.n_kv_heads,
                               cache.seq_len + self.window, c.head_dim,
                               dtype=self.target.dtype, device=cache.device)
        cos, sin = rope_tables(c.rope_args(), self.context.seq_len, self.target.dtype,
                               cache.device)
        self.cos, self.sin = cos, sin

    @property
    def window(self) -> int:
        """Positions a step can commit past the context: a block's depth and its bonus, twice
        under two-level verification (the Q path, then a block drafted after it)."""
        return 2 * self.config.block_size

    def _require_bound(self) -> KVCache:
        if self.cache is None:
            raise W12Error("block drafter: bind it to the target's cache before drafting "
                           "(SpecRunner does)")
        return self.cache

    @torch.inference_mode()
    def start(self, prompts: list[list[int]], first: list[int]) -> None:
        cache = self._require_bound()
        longest = max(map(len, prompts))
        slots = torch.arange(longest, device=cache.device).expand(cache.batch, longest)
        self._ingest(slots)
        self.context.lengths.copy_(cache.lengths)

    @torch.inference_mode()
    def admit(self, row: int, prompt: list[int], first: int) -> None:
        """A request prefilled into ``row`` while the others go on: its prompt's context
        entries, from the taps the prefill left in that row."""
        slots = torch.arange(len(prompt), device=self.context.device)[None, :]
        self._ingest(slots, self.taps.row(row), self.context.row(row))
        self.context.lengths[row] = len(prompt)

    def _ingest(self, slots: torch.Tensor, taps=None, context: KVCache | None = None) -> None:
        """Context entries of the positions at ``slots`` [B, W] from the target's taps (of
        every row, or of the rows of ``taps`` into ``context``)."""
        taps = self.taps if taps is None else taps
        context = self.context if context is None else context
        states = self.net.context(taps.read(slots).to(self.target.dtype))
        cos, sin = self.cos[slots].unsqueeze(2), self.sin[slots].unsqueeze(2)
        for i, layer in enumerate(self.net.layers):
            k, v = layer.keys_values(states, cos, sin)
            context.write(i, slots, k, v)

    @torch.inference_mode()
    def propose(self, roots, cache, budget, tree):
        # the last step committed at most ``window`` positions past the context
        self._ingest(self.context.lengths[:, None] + torch.arange(self.window,
                                                                  device=roots.device))
        self.context.lengths.copy_(cache.lengths)
        return self._draft(roots, budget, tree)

    @torch.inference_mode()
    def propose_after(self, roots, context, counts, cache, budget, tree, path):
        # the Q pass wrote its path's hidden states at the tree's scratch slots: move them to
        # the positions they would take if committed (scratch too: the exact pass rewrites
        # every slot past the lengths), make them context entries, draft from the Q bonus
        lengths = cache.lengths
        taps = self._require_bound().hidden
        taps.keep(torch.where(path >= 0, path + lengths[:, None], -1), lengths, counts)
        self._ingest(lengths[:, None] + torch.arange(self.window, device=roots.device))
        self.context.lengths.copy_(lengths + counts)
        try:
            return self._draft(context.gather(1, (counts - 1)[:, None])[:, 0], budget, tree)
        finally:
            self.context.lengths.copy_(lengths)

    def _draft(self, roots: torch.Tensor, budget: int, tree: bool) -> DraftTree:
        block = self.config.block_size
        depth = min(budget - 1, block - 1, MAX_TREE_DEPTH if tree else block)
        if depth == 0:
            return DraftTree.chain(roots, roots[:, None][:, :0])
        logp = self.block_logprobs(roots)[:, :depth]
        if not tree:  # the block's top-1, then padding up to the budget (never accepted)
            drafted = F.pad(logp.argmax(dim=-1), (0, budget - 1 - depth))
            return DraftTree.chain(roots, drafted, torch.full_like(roots, depth))
        top_logp, top_tokens = logp.topk(min(self.top_k, budget - 1), dim=-1)
        return best_first(roots, top_tokens, top_logp, budget)

    def block_logprobs(self, roots: torch.Tensor) -> torch.Tensor:
        """[B, block - 1, V] log-probabilities of the mask positions after ``roots`` [B] at
        the committed lengths, over the context entries in the drafter's cache."""
        c, ctx = self.config, self.context
        lengths = ctx.lengths
        pos = lengths[:, None] + torch.arange(c.block_size, device=roots.device)
        x = self.net.block_inputs(F.embedding(roots, self.target.embed))
        slots = torch.arange(ctx.seq_len, device=roots.device)
        visible = torch.cat([(slots < lengths[:, None])[:, None, :].expand(-1, c.block_size, -1),
                             torch.ones(roots.shape[0], c.block_size, c.block_size,
                                        dtype=torch.bool, device=roots.device)], dim=2)
        contexts = [ctx.layer(i) for i in range(c.n_layers)]
        h = self.net(x, self.cos[pos].unsqueeze(2), self.sin[pos].unsqueeze(2), contexts,
                     visible)
        return self.target.lm_head(h[:, 1:]).float().log_softmax(dim=-1)


def resolve_drafter_folder(name: str) -> Path | None:
    """``demo`` (the drafter shipped for the demo model) or a drafter folder; None otherwise."""
    if name == "demo":
        if not (DEMO_DRAFTER / "config.json").is_file():
            raise W12Error("the demo block drafter is not shipped in this installation "
                           f"({DEMO_DRAFTER} is missing): train one with 'w12 draft train' "
                           "and pass its folder to --drafter")
        return DEMO_DRAFTER
    folder = Path(name)
    return folder if folder.is_dir() else None
