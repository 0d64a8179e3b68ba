"""Building a ``Transformer`` from a BF16 HF folder, a W12 folder or a synthetic preset.

All three are *sources* that answer ``has(name)`` and ``read(name)`` with Hugging Face tensor
names, returning a plain tensor or a ``W12Tensor``; one loader walks the names the config
implies, checks every shape against the config, and fills the model layer by layer on the
target device (so host memory holds one layer at a time). The weight mode is independent of
the source: ``bf16`` decodes W12 tensors at load, ``w12`` encodes BF16 ones at load (on the
device when it is a GPU), so one folder can be timed both ways in the same run.

A synthetic source draws each tensor from its own generator seeded by (seed, name), directly
on the device, so a 32B-shaped model appears in seconds and the BF16 and W12 builds of one seed
hold the same weights.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model import Linear, ModelArgs, Transformer
from engine.w12_backend import cat_rows, prepare, prepare_view, tensor_bytes, view_bf16
from w12.errors import W12Error
from w12.jsonio import read_json_object
from w12.tensor import W12Tensor, encode

SYNTHETIC_PREFIX = "synthetic:"
MODES = ("bf16", "w12", "view8")


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config must hold, with its shape (lm_head if untied)."""
    d, q, kv, ff = args.dim, args.q_size, args.kv_size, args.intermediate_size
    shapes = {"model.embed_tokens.weight": (args.vocab_size, d), "model.norm.weight": (d,)}
    if not args.tie_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, d)
    for i in range(args.n_layers):
        p = f"model.layers.{i}."
        if args.is_gdn(i):
            shapes |= {p + k: v for k, v in gdn_shapes(args).items()}
            continue
        layer = {
            "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
            "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
            "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
            "mlp.gate_proj.weight": (ff, d), "mlp.up_proj.weight": (ff, d),
            "mlp.down_proj.weight": (d, ff),
        }
        if args.qkv_bias:
            layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                      "self_attn.v_proj.bias": (kv,)}
        if args.o_bias:
            layer["self_attn.o_proj.bias"] = (d,)
        if args.mlp_bias:
            layer |= {"mlp.gate_proj.bias": (ff,), "mlp.up_proj.bias": (ff,),
                      "mlp.down_proj.bias": (d,)}
        if args.qk_norm:
            layer |= {"self_attn.q_norm.weight": (args.head_dim,),
                      "self_attn.k_norm.weight": (args.head_dim,)}
        shapes |= {p + k: v for k, v in layer.items()}
    return shapes


def gdn_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """A hybrid's GDN layer: its tensors under ``model.layers.{i}.`` (Qwen3-Next's names)."""
    d, ff = args.dim, args.intermediate_size
    hk, hv, dk, dv = args.gdn_shape
    channels = 2 * hk * dk + hv * dv
    return {
        "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
        "linear_attn.in_proj_qkvz.weight": (channels + hv * dv, d),
        "linear_attn.in_proj_ba.weight": (2 * hv, d),
        "linear_attn.conv1d.weight": (channels, 1, args.gdn_conv),
        "linear_attn.A_log": (hv,), "linear_attn.dt_bias": (hv,),
        "linear_attn.norm.weight": (dv,), "linear_attn.out_proj.weight": (d, hv * dv),
        "mlp.gate_proj.weight": (ff, d), "mlp.up_proj.weight": (ff, d),
        "mlp.down_proj.weight": (d, ff),
    }


def read_json(path: Path, *, required: bool) -> dict:
    """A JSON object file; a missing optional file reads as ``{}``."""
    return read_json_object(path, required=required) or {}


def read_config(folder: Path) -> dict:
    return read_json(Path(folder) / "config.json", required=True)


def is_w12_config(config: dict) -> bool:
    quant = config.get("quantization_config") or {}
    return isinstance(quant, dict) and quant.get("quant_method") == "w12"


class FolderSource:
    """Tensors of a BF16 Hugging Face folder or a W12 folder, read one at a time."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise W12Error(f"{self.folder}: not a folder (nor a synthetic:<preset> name)")
        self.config = read_config(self.folder)
        self.is_w12 = is_w12_config(self.config)
        if self.is_w12:
            from w12.container import FolderReader

            self.reader = FolderReader(self.folder)
        else:
            from converters.source import HFCheckpoint

            self.reader = HFCheckpoint(self.folder)
        self._names = set(self.reader.names())

    def has(self, name: str) -> bool:
        return name in self._names

    def read(self, name: str) -> torch.Tensor | W12Tensor:
        return self.reader.read(name)


class SyntheticSource:
    """Random N(0, sigma) BF16 weights with the shapes of a preset, drawn on ``device``."""

    def __init__(self, config: dict, *, seed: int, device: torch.device) -> None:
        self.config, self.seed, self.device = config, seed, torch.device(device)
        self.is_w12 = False
        self.folder = None
        self.shapes = expected_shapes(ModelArgs.from_hf_config(config))

    def has(self, name: str) -> bool:
        return name in self.shapes

    def read(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        out = torch.randn(shape, generator=gen, device=self.device, dtype=torch.float32)
        mean, std = synthetic_stats(name, shape)
        return (out.mul_(std).add_(mean)).to(torch.bfloat16)


def synthetic_stats(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(mean, sigma) of a synthetic tensor, by role.

    Norm weights sit near 1 with a small spread; embeddings and LM head use the usual 0.02;
    projections use sigma = c / sqrt(fan_in) with c ~ 1 for attention and MLP inputs and a
    smaller c for the output projections (o_proj, down_proj), as trained checkpoints show.
    """
    if name.endswith("norm.weight"):
        return 1.0, 0.05
    if name.endswith("A_log"):  # -exp(A_log) * softplus(a + dt_bias): gates of ~ -0.05 a token
        return 0.0, 0.5
    if name.endswith("dt_bias"):
        return -3.0, 0.5
    if name.endswith("conv1d.weight"):
        return 0.0, 0.5
    if name.endswith(".bias"):
        return 0.0, 0.02
    if "embed_tokens" in name or name.startswith("lm_head"):
        return 0.0, 0.02
    c = 0.6 if ("o_proj" in name or "down_proj" in name) else 1.0
    return 0.0, c / math.sqrt(shape[-1])


@dataclass
class LoadedModel:
    model: Transformer
    args: ModelArgs
    name: str
    mode: str
    folder: Path | None  # the source folder (tokenizer files live there); None for synthetic
    weight_bytes: int


def open_source(spec: str | Path, *, seed: int = 0, device="cpu"):
    """A folder path or ``synthetic:<preset>`` -> (source, hf config dict, display name)."""
    text = str(spec)
    if text.startswith(SYNTHETIC_PREFIX):
        from engine.presets import preset_config

        config = preset_config(text[len(SYNTHETIC_PREFIX):])
        return SyntheticSource(config, seed=seed, device=torch.device(device)), config, text
    source = FolderSource(Path(spec))
    return source, source.config, Path(spec).name or str(spec)


def load_model(
    spec: str | Path, *, mode: str | None = None, device="cpu",
    dtype: torch.dtype = torch.bfloat16, seed: int = 0, w12_lm_head: bool = True,
) -> LoadedModel:
    """Build the model named by ``spec`` with its linears in ``mode`` ("bf16", "w12" or
    "view8": the 8-bit view of the W12 weights, the two-level verifier's Q pass: on a GPU its
    high planes, one byte a weight, run by the view GEMM; on the CPU the BF16 tensors of its
    values).

    ``mode=None`` runs a W12 folder as W12 and anything else as BF16. In W12 mode the LM head
    runs in W12 too (a tied one gets its own W12 copy of the embedding) unless
    ``w12_lm_head=False`` keeps a BF16 head in BF16.
    """
    device = torch.device(device)
    source, config, name = open_source(spec, seed=seed, device=device)
    mode = mode or ("w12" if source.is_w12 else "bf16")
    if mode not in MODES:
        raise W12Error(f"weight mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "w12" and dtype != torch.bfloat16:
        raise W12Error(f"W12 weights run with bfloat16 activations, not {dtype}")
    where = f"{source.folder}/config.json" if source.folder else name
    args = ModelArgs.from_hf_config(config, source=where)
    check_fits(args, mode, device)
    try:
        model = _Loader(source, args, mode, device, dtype, w12_lm_head).build()
    except torch.OutOfMemoryError as exc:
        raise W12Error(
            f"{name}: out of memory while loading on {device}; the {mode} weights need about "
            f"{estimate_weight_bytes(args, mode) / 2**30:.1f} GiB"
        ) from exc
    return LoadedModel(model, args, name, mode, source.folder, weight_bytes(model))


def estimate_weight_bytes(args: ModelArgs, mode: str) -> int:
    shapes = expected_shapes(args)
    linear = sum(math.prod(s) for n, s in shapes.items() if n.endswith("proj.weight"))
    if not args.tie_embeddings:
        linear += args.vocab_size * args.dim
    other = sum(math.prod(s) for s in shapes.values()) - linear
    return int(other * 2 + linear * {"w12": 1.5, "view8": 1.0}.get(mode, 2))


def check_fits(args: ModelArgs, mode: str, device: torch.device) -> None:
    """Refuse up front, with the numbers, a model whose weights cannot fit in free GPU memory."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    need = estimate_weight_bytes(args, mode)
    if need > free:
        raise W12Error(
            f"the {mode} weights need about {need / 2**30:.1f} GiB of GPU memory, "
            f"only {free / 2**30:.1f} GiB is free on {device}"
        )


def weight_bytes(model: Transformer) -> int:
    """Bytes of every weight the model holds (a tensor shared by embedding and head once)."""
    seen, total = set(), 0
    tensors = [model.embed, model.norm]
    for module in model.modules():
        if isinstance(module, Linear):
            tensors += [module.weight, module.bias]
            total += tensor_bytes(module.packed) if module.packed is not None else 0
    for layer in model.layers:
        tensors += [layer.attn_norm, layer.mlp_norm]
        tensors += [getattr(layer.attn, name, None)  # attention's q/k norms, a GDN layer's own
                    for name in ("q_norm", "k_norm", "conv", "a_log", "dt_bias", "norm")]
    for t in tensors:
        if t is not None and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


class _Loader:
    def __init__(self, source, args, mode, device, dtype, w12_lm_head) -> None:
        self.source, self.args, self.mode = source, args, mode
        self.device, self.dtype, self.w12_lm_head = device, dtype, w12_lm_head
        self.shapes = expected_shapes(args)
        self.where = str(source.folder) if source.folder else "synthetic source"

    def build(self) -> Transformer:
        a, model = self.args, Transformer(self.args)
        embed = self.read("model.embed_tokens.weight")
        model.embed = self.dense(embed)
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            layer.attn_norm = self.plain(p + "input_layernorm.weight")
            layer.mlp_norm = self.plain(p + "post_attention_layernorm.weight")
            self.linear(layer.w13, [p + "mlp.gate_proj", p + "mlp.up_proj"], a.mlp_bias)
            self.linear(layer.w2, [p + "mlp.down_proj"], a.mlp_bias)
            if a.is_gdn(i):
                self.gdn(layer.attn, p + "linear_attn.")
                continue
            attn = p + "self_attn."
            self.linear(layer.attn.wqkv, [attn + s for s in ("q_proj", "k_proj", "v_proj")],
                        a.qkv_bias)
            self.linear(layer.attn.wo, [attn + "o_proj"], a.o_bias)
            if a.qk_norm:
                layer.attn.q_norm = self.plain(attn + "q_norm.weight")
                layer.attn.k_norm = self.plain(attn + "k_norm.weight")
        model.norm = self.plain("model.norm.weight")
        self.lm_head(model, embed)
        return model

    def gdn(self, mixer, p: str) -> None:
        """A GDN layer's linears (W12 or BF16 like the rest) and its small float tensors."""
        self.linear(mixer.wqkvz, [p + "in_proj_qkvz"], False)
        self.linear(mixer.wba, [p + "in_proj_ba"], False)
        self.linear(mixer.wo, [p + "out_proj"], False)
        mixer.conv = self.plain(p + "conv1d.weight")[:, 0]
        mixer.a_log = self.plain(p + "A_log")
        mixer.dt_bias = self.plain(p + "dt_bias")
        mixer.norm = self.plain(p + "norm.weight")

    def lm_head(self, model: Transformer, embed) -> None:
        # A tied model may still store lm_head.weight; then the stored tensor is used.
        if self.source.has("lm_head.weight") or not self.args.tie_embeddings:
            weight = self.read("lm_head.weight", (self.args.vocab_size, self.args.dim))
        else:
            weight = embed
        # In W12 mode the head runs through the W12 GEMM even when it is tied to a BF16
        # embedding (three quarters of the table again in memory): every GEMM of the model is
        # then batch-invariant, which speculative decoding's exactness needs.
        if self.mode == "view8":
            self.view(model.lm_head, [weight])
        elif self.mode == "w12" and (isinstance(weight, W12Tensor) or self.w12_lm_head):
            model.lm_head.packed = prepare(self.to_w12(weight))
        elif weight is embed:
            model.lm_head.weight = model.embed
        else:
            model.lm_head.weight = self.dense(weight)

    def read(self, name: str, shape: tuple[int, ...] | None = None):
        shape = shape or self.shapes[name]
        if not self.source.has(name):
            raise W12Error(
                f"{self.where}: tensor {name} is missing (the config describes a "
                f"{self.args.n_layers}-layer {self.args.arch} model)"
            )
        value = self.source.read(name)
        got = tuple(value.shape)
        if got != tuple(shape):
            raise W12Error(f"{self.where}: tensor {name} has shape {got}, the config implies "
                           f"{tuple(shape)}")
        return value

    def plain(self, name: str) -> torch.Tensor:
        return self.dense(self.read(name))

    def dense(self, value) -> torch.Tensor:
        if isinstance(value, W12Tensor):  # decode where it is fastest: on the GPU if there is one
            return value.to(self.device).decode().to(self.dtype)
        return value.to(device=self.device, dtype=self.dtype)

    def to_w12(self, value) -> W12Tensor:
        if isinstance(value, W12Tensor):
            return value.to(self.device)
        return encode(value.to(device=self.device, dtype=torch.bfloat16))

    def view(self, module: Linear, parts: list) -> None:
        """The 8-bit view of the weights ``parts`` (stacked by rows) into ``module``: packed for
        the view GEMM on a GPU with BF16 activations, else as tensors of its values."""
        if self.device.type == "cuda" and self.dtype == torch.bfloat16:
            module.packed = prepare_view(cat_rows([self.to_w12(part) for part in parts]))
        else:
            views = [view_bf16(self.to_w12(part)) for part in parts]
            module.weight = torch.cat(views).to(self.dtype)

    def linear(self, module: Linear, prefixes: list[str], bias: bool) -> None:
        parts = [self.read(p + ".weight") for p in prefixes]
        if self.mode == "w12":
            module.packed = prepare(cat_rows([self.to_w12(part) for part in parts]))
        elif self.mode == "view8":
            self.view(module, parts)
        else:
            module.weight = torch.cat([self.dense(part) for part in parts])
        if bias:
            module.bias = torch.cat([self.plain(p + ".bias") for p in prefixes])
