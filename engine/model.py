"""Dense decoder-only transformers (Llama, Qwen2, Qwen3) in one small module.

One ``Transformer`` covers the three families; their differences are flags in ``ModelArgs``
(q/k/v bias for Qwen2, per-head RMSNorm on q and k for Qwen3, tied embeddings, RoPE scaling).
Q/K/V and gate/up are fused into one linear each, so a decode step runs four GEMMs per layer.
Every linear is an engine ``Linear`` that holds either a BF16 tensor (torch GEMM) or a prepared
W12 weight (``w12_linear``); the rest of the model does not know which.

The KV cache is an object of its own (``engine.cache.KVCache``) passed to every forward with an
``AttentionPlan`` that says where the new rows go and which cache slots each of them sees: a
prefill chunk, a one-token decode step per request, or the nodes of a draft tree. Every request
has its own positions, so a batch can mix prompt lengths (right-padded in prefill, padding
written past the prompt and overwritten by the tokens that follow) and a step has fixed shapes
for CUDA graphs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionPlan, attend
from engine.cache import KVCache
from engine.ops import OpSet
from engine.w12_backend import dense_linear, w12_matmul
from w12.errors import W12Error

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    # a dense hybrid: Gated DeltaNet layers (Qwen3-Next's layer) and Qwen3 attention layers in
    # the order ``layer_types`` gives (Qwen3.5's dense hybrids: three GDN layers, then one
    # attention layer); see engine.gated_delta
    "W12HybridForCausalLM": "hybrid",
}
LAYER_TYPES = ("full_attention", "linear_attention")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass
class ModelArgs:
    arch: str = "llama"
    vocab_size: int = 32000
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 14336
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_seq_len: int = 8192
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    extra: dict = field(default_factory=dict)  # bos/eos ids and other pass-through fields
    # hybrids: each layer's kind (LAYER_TYPES; None: all attention), and the GDN layers' key
    # heads, value heads, key and value head dims, and convolution width
    layer_types: tuple[str, ...] | None = None
    gdn_shape: tuple[int, int, int, int] = (0, 0, 0, 0)
    gdn_conv: int = 4

    @classmethod
    def from_hf_config(cls, cfg: dict, source: str = "config.json") -> ModelArgs:
        """Build from a Hugging Face ``config.json`` dict; unsupported models raise W12Error."""
        arch = _architecture(cfg, source)
        if cfg.get("hidden_act", "silu") != "silu":
            raise W12Error(f"{source}: hidden_act {cfg['hidden_act']!r} is not supported (silu)")
        if cfg.get("use_sliding_window"):
            raise W12Error(f"{source}: sliding-window attention is not supported")
        get = _getter(cfg, source)
        n_heads = int(get("num_attention_heads"))
        hybrid = _hybrid_fields(cfg, source, get) if arch == "hybrid" else {}
        dim = int(get("hidden_size"))
        theta, scaling = _rope_config(cfg, source)
        attention_bias = bool(cfg.get("attention_bias", False))
        return cls(
            arch=arch,
            vocab_size=int(get("vocab_size")),
            dim=dim,
            n_layers=int(get("num_hidden_layers")),
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or dim // n_heads),
            intermediate_size=int(get("intermediate_size")),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_seq_len=int(cfg.get("max_position_embeddings", 4096)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or attention_bias,
            o_bias=attention_bias and arch != "qwen2",
            mlp_bias=bool(cfg.get("mlp_bias", False)) and arch == "llama",
            qk_norm=arch in ("qwen3", "hybrid"),
            extra={k: cfg[k] for k in ("bos_token_id", "eos_token_id") if k in cfg},
            **hybrid,
        )

    @classmethod
    def from_name(cls, name: str) -> ModelArgs:
        from engine.presets import preset_config

        return cls.from_hf_config(preset_config(name), source=f"preset {name!r}")

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def is_gdn(self, layer: int) -> bool:
        return self.layer_types is not None and self.layer_types[layer] == "linear_attention"

    @property
    def attention_layers(self) -> list[int]:
        """Indices of the layers with a KV cache (all of them unless hybrid)."""
        return [i for i in range(self.n_layers) if not self.is_gdn(i)]

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if self.is_gdn(i)]

    def to_dict(self) -> dict:
        return asdict(self)


def _architecture(cfg: dict, source: str) -> str:
    names = cfg.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    if not names and cfg.get("model_type") in ARCHITECTURES.values():
        return cfg["model_type"]
    found = names[0] if names else cfg.get("model_type")
    raise W12Error(
        f"{source}: architecture {found!r} is not supported "
        f"(supported: {', '.join(ARCHITECTURES)})"
    )


def _hybrid_fields(cfg: dict, source: str, get) -> dict:
    types = tuple(get("layer_types"))
    if len(types) != int(get("num_hidden_layers")) or set(types) - set(LAYER_TYPES):
        raise W12Error(f"{source}: layer_types must name one of {', '.join(LAYER_TYPES)} per "
                       f"layer ({get('num_hidden_layers')}), got {list(types)}")
    shape = tuple(int(get(k)) for k in ("linear_num_key_heads", "linear_num_value_heads",
                                        "linear_key_head_dim", "linear_value_head_dim"))
    if shape[1] % shape[0]:
        raise W12Error(f"{source}: {shape[1]} GDN value heads over {shape[0]} key heads")
    return {"layer_types": types, "gdn_shape": shape,
            "gdn_conv": int(cfg.get("linear_conv_kernel_dim", 4))}


def _getter(cfg: dict, source: str):
    def get(key: str):
        if key not in cfg or cfg[key] is None:
            raise W12Error(f"{source}: required field {key!r} is missing")
        return cfg[key]

    return get


def _rope_config(cfg: dict, source: str) -> tuple[float, dict | None]:
    """RoPE base and scaling from either the v4 keys (rope_theta, rope_scaling) or v5 ones."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise W12Error(
            f"{source}: rope type {rope_type!r} is not supported ({', '.join(ROPE_TYPES)})"
        )
    return theta, None if rope_type == "default" else {"rope_type": rope_type, **params}


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [D/2] in fp32, with linear or llama3 (Llama 3.1) scaling applied."""
    d = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = args.rope_scaling or {}
    if scaling.get("rope_type") == "linear":
        return inv / float(scaling["factor"])
    if scaling.get("rope_type") == "llama3":
        return _llama3_scaling(inv, scaling)
    return inv


def _llama3_scaling(inv: torch.Tensor, s: dict) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    factor, old_len = float(s["factor"]), float(s["original_max_position_embeddings"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - low) / (high - low)
    mixed = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > old_len / low, inv / factor, inv)
    between = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(between, mixed, out)


def rope_tables(args: ModelArgs, seq_len: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq_len, D] for positions 0..seq_len-1, computed in fp32."""
    inv = rope_inv_freq(args).to(device)
    angles = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Linear(nn.Module):
    """``x @ W.T + b`` with ``W`` either a plain tensor or a prepared W12 weight (``packed``)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight: torch.Tensor | None = None
        self.packed = None
        self.bias: torch.Tensor | None = None

    @property
    def is_w12(self) -> bool:
        return self.packed is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return dense_linear(x, self.weight, self.bias)
        y = w12_matmul(x.reshape(-1, x.shape[-1]), self.packed, self.bias)
        return y.view(*x.shape[:-1], self.out_features)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, index: int) -> None:
        super().__init__()
        self.args, self.index = args, index
        self.wqkv = Linear(args.dim, args.q_size + 2 * args.kv_size)
        self.wo = Linear(args.q_size, args.dim)
        self.q_norm: torch.Tensor | None = None  # Qwen3: RMSNorm weights [D] shared by heads
        self.k_norm: torch.Tensor | None = None

    def forward(self, x, step: Step):
        a = self.args
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split([a.q_size, a.kv_size, a.kv_size], dim=-1)
        q = q.view(b, t, a.n_heads, a.head_dim)
        k = k.view(b, t, a.n_kv_heads, a.head_dim)
        v = v.view(b, t, a.n_kv_heads, a.head_dim)
        if self.q_norm is not None:  # Qwen3: RMSNorm per head before RoPE
            q = step.ops.rms_norm(q, self.q_norm, a.norm_eps)
            k = step.ops.rms_norm(k, self.k_norm, a.norm_eps)
        q, k = step.ops.rope_qk(q, k, step.cos, step.sin)
        step.cache.write(self.index, step.plan.slots, k, v)
        k_cache, v_cache = step.cache.layer(self.index)
        return self.wo(attend(q, k, v, k_cache, v_cache, step.plan, step.attention, step.ops))


class Block(nn.Module):
    def __init__(self, args: ModelArgs, index: int) -> None:
        super().__init__()
        self.args = args
        # the token mixer: attention, or a GDN layer in a hybrid; each indexes its own kind's
        # layers in the cache (the KV cache holds attention layers only)
        if args.is_gdn(index):
            from engine.gated_delta import GatedDeltaNet

            self.attn = GatedDeltaNet(args, args.gdn_layers.index(index))
        else:
            self.attn = Attention(args, args.attention_layers.index(index))
        self.w13 = Linear(args.dim, 2 * args.intermediate_size)  # gate and up, fused
        self.w2 = Linear(args.intermediate_size, args.dim)
        self.attn_norm: torch.Tensor | None = None
        self.mlp_norm: torch.Tensor | None = None

    def forward(self, x, x_normed, next_norm, step: Step):
        """Residual stream ``x`` and its normed copy in; the same for the next layer out.

        Each residual add is fused with the RMSNorm that follows it (the next layer's input
        norm, or the final norm after the last layer).
        """
        eps, ops = self.args.norm_eps, step.ops
        x, h = ops.add_rms_norm(x, self.attn(x_normed, step), self.mlp_norm, eps)
        return ops.add_rms_norm(x, self.w2(ops.swiglu(self.w13(h))), next_norm, eps)


@dataclass
class Step:
    """What every layer of one forward pass shares: the cache, where the rows go in it and
    what they see, their RoPE rows, and the instance's op set and attention kind."""

    cache: KVCache
    plan: AttentionPlan
    cos: torch.Tensor
    sin: torch.Tensor
    ops: OpSet
    attention: str
    valid: torch.Tensor | None = None  # [B] real rows of a right-padded prefill chunk
    gdn: str = "auto"  # a hybrid's GDN verify kernel on a GPU (engine.gated_delta.GDN_KERNELS)
    gdn_plan: tuple | torch.Tensor | None = None  # the walk's plan (or WY's ancestor mask) of
    # this forward's trees, made by the first GDN layer that verifies them, reused by the others


class Transformer(nn.Module):
    """The decoder. Options are per instance: ``ops`` (eager or compiled elementwise
    functions), ``attention`` (``"tree"`` or ``"torch"``) and, for hybrids, ``gdn`` (the GPU
    verify kernel of the GDN layers, ``"auto"``, ``"walk"``, ``"path"`` or ``"wy"``), set by
    whoever runs it."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.layers = nn.ModuleList(Block(args, i) for i in range(args.n_layers))
        self.lm_head = Linear(args.dim, args.vocab_size)
        self.embed: torch.Tensor | None = None
        self.norm: torch.Tensor | None = None
        self.ops = OpSet()
        self.attention = "torch"
        self.gdn = "auto"
        self._rope: tuple[int, torch.Tensor, torch.Tensor] | None = None

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.dtype

    def new_cache(self, batch: int, seq_len: int) -> KVCache:
        """A cache for ``batch`` requests of up to ``seq_len`` positions (RoPE tables too)."""
        self.rope_tables(seq_len)
        cache = KVCache.for_model(self.args, batch, seq_len, dtype=self.dtype, device=self.device)
        if self.args.gdn_layers:
            from engine.gated_delta import RecurrentState

            cache.recurrent = RecurrentState(len(self.args.gdn_layers), batch, self.args,
                                             dtype=self.dtype, device=self.device)
        return cache

    def score(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] of whole sequences ``tokens`` [B, T] in one causal pass over a
        scratch cache (teacher forcing)."""
        b, t = tokens.shape
        pos = torch.arange(t, device=tokens.device).expand(b, t)
        return self(tokens, pos, self.new_cache(b, t), AttentionPlan.prefill(pos))

    def rope_tables(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [>= seq_len, D], computed once for the longest length asked so far."""
        if self._rope is None or self._rope[0] < seq_len:
            cos, sin = rope_tables(self.args, seq_len, self.dtype, self.device)
            self._rope = (seq_len, cos, sin)
        return self._rope[1], self._rope[2]

    def forward(
        self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache, plan: AttentionPlan, *,
        last: torch.Tensor | None = None, n_layers: int | None = None,
        hidden: list[torch.Tensor] | None = None, taps: tuple[int, ...] = (),
        head: bool = True,
    ) -> torch.Tensor:
        """Logits (fp32) for ``tokens`` [B, T] at positions ``pos`` [B, T], their keys and
        values written into ``cache`` as ``plan`` says.

        ``last`` [B] picks one position per row, so the LM head runs on B rows instead of
        B*T. ``n_layers`` runs only the first layers (then the final norm and the head: the
        early-exit view of the model). ``hidden`` collects the residual stream after each
        layer index in ``taps``; a cache with ``hidden`` taps also keeps its layers' outputs at
        the plan's slots. ``head=False`` returns the LM head's input instead of the logits
        (BF16 [B, T, dim], after the final norm), for a head that runs apart
        (``engine.head``).
        """
        cos, sin = self.rope_tables(cache.seq_len)
        step = Step(cache, plan, cos[pos].unsqueeze(2), sin[pos].unsqueeze(2), self.ops,
                    self.attention, last + 1 if plan.causal and last is not None else None,
                    self.gdn)
        layers = self.layers if n_layers is None else self.layers[:n_layers]
        x = F.embedding(tokens, self.embed)
        h = self.ops.rms_norm(x, layers[0].attn_norm, self.args.norm_eps)
        norms = [layer.attn_norm for layer in layers[1:]] + [self.norm]
        kept = cache.hidden  # the cache keeps some layers' outputs per slot (a block drafter's)
        for i, (layer, next_norm) in enumerate(zip(layers, norms, strict=True)):
            x, h = layer(x, h, next_norm, step)
            if i in taps:
                hidden.append(x)
            if kept is not None and i in kept.index:
                kept.write(i, plan.slots, x)
        if last is not None:
            h = h[torch.arange(h.shape[0], device=h.device), last].unsqueeze(1)
        return self.lm_head(h).float() if head else h
