"""The W12 quantization method for SGLang: ``W12Config`` and ``W12LinearMethod``.

``W12Config`` reads the ``quantization_config`` that ``w12 convert`` writes into ``config.json``
and decides per layer: a linear layer (or LM head) whose checkpoint weights are W12 gets a
``W12LinearMethod``, an unconverted one SGLang's unquantized method, and any other layer that
holds W12 weights (embeddings, fused MoE experts) is refused with a ``W12Error``. Fused layers
(``qkv_proj``, ``gate_up_proj``) map to their checkpoint parts through the model's
``packed_modules_mapping``; all parts must be W12 or none.

``W12LinearMethod.create_weights`` registers the six checkpoint planes as parameters named
``w12_<part>`` (so SGLang's model loader routes ``<module>.w12_hi`` etc. to them): ``hi``
[N, K] and ``lo`` [N, ceil(K/2)] with ``output_dim`` 0 and ``input_dim`` 1, ``e0`` [N] and
``esc_rowptr`` [N + 1] with ``output_dim`` 0, where N and K are this rank's sizes. Escape lists
are ragged (their length is unknown before the checkpoint is read), so ``esc_col`` and
``esc_val`` start empty: each parameter's own weight loader cuts this rank's block out of the
full checkpoint tensor (``shard``), writing the dense planes in place and keeping the escapes of
each fused shard aside until that shard's three escape tensors have all arrived.
``process_weights_after_loading`` checks that every part of every shard arrived, joins the
escape pieces into one CSR list (rows beyond the checkpoint, i.e. vocabulary padding of the LM
head, become rows of +0 escapes, as SGLang zero-fills them), repacks the planes for the GEMM
with ``prepare_weight`` and frees the checkpoint-layout planes. ``apply`` calls ``w12_linear``,
keeping batch invariance only up to 64 rows (nothing under SGLang needs more). Under SGLang's
``--load-format dummy`` (nothing read) a layer gets random planes instead. A W12 LM head
also answers ``weight`` (SGLang's ``get_embed_and_head``, which EAGLE uses to share the head with
its draft model): the rank's BF16 rows, decoded on first access and kept.

Checkpoints saved already split per rank, or with fused tensors (one ``qkv_proj``), are refused.
"""

from __future__ import annotations

import zlib

import torch
from sglang.srt.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from sglang.srt.layers.quantization.base_config import LinearMethodBase, QuantizationConfig
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
from sglang.srt.utils import set_weight_attrs

from sglang_integration import shard
from w12 import container, spec
from w12.errors import W12Error
from w12.tensor import PLANE_DTYPES, W12Tensor
from w12_kernels.gemm import SMALL_M_MAX, decode_weight, prepare_weight, w12_linear

NAME = container.QUANT_METHOD
# Names of the checkpoint parts of SGLang's fused layers when the model declares none.
DEFAULT_PACKED_MODULES = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}
_SUPPORTED_LAYERS = (ReplicatedLinear, ColumnParallelLinear, RowParallelLinear, ParallelLMHead)


class W12Config(QuantizationConfig):
    """SGLang's view of a W12 checkpoint's ``quantization_config``."""

    def __init__(self, checkpoint: container.QuantizationConfig | None = None,
                 packed_modules_mapping: dict[str, list[str]] | None = None) -> None:
        super().__init__()
        if checkpoint is None:
            raise W12Error("quantization w12 needs a checkpoint written by 'w12 convert' "
                           "(its config.json has no W12 quantization_config)")
        self.checkpoint = checkpoint
        self.packed_modules_mapping = dict(packed_modules_mapping or {})
        self._converted = frozenset(checkpoint.converted_modules)
        self._holders = frozenset(_ancestors(checkpoint.converted_modules))

    @classmethod
    def from_config(cls, config: dict) -> W12Config:
        checkpoint = container.parse_quantization_config(config)
        return cls(checkpoint, config.get("packed_modules_mapping"))

    def get_name(self) -> str:
        return NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # the config is config.json's quantization_config

    def get_scaled_act_names(self) -> list[str]:
        return []

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase | ParallelLMHead):
            return self._linear_method(layer, prefix)
        if prefix in self._holders:
            raise W12Error(f"{prefix}: {type(layer).__name__} weights stored as W12 cannot be "
                           f"served by SGLang; convert the checkpoint without them")
        return None

    def checkpoint_modules(self, prefix: str) -> list[str]:
        """The checkpoint modules behind the layer ``prefix`` (several for a fused layer)."""
        mapping = {**DEFAULT_PACKED_MODULES, **self.packed_modules_mapping}
        leaf = prefix.rsplit(".", 1)[-1]
        base = prefix[: len(prefix) - len(leaf)]
        return [base + part for part in mapping.get(leaf, [leaf])]

    def _linear_method(self, layer: torch.nn.Module, prefix: str):
        modules = self.checkpoint_modules(prefix)
        stored = [module in self._converted for module in modules]
        if not any(stored):
            return UnquantizedLinearMethod() if isinstance(layer, LinearBase) else None
        if not all(stored):
            plain = [m for m, is_w12 in zip(modules, stored, strict=True) if not is_w12]
            raise W12Error(f"{prefix}: fused layer mixes W12 and plain checkpoint weights "
                           f"(plain: {', '.join(plain)})")
        if not isinstance(layer, _SUPPORTED_LAYERS):
            raise W12Error(f"{prefix}: W12 does not support layer type {type(layer).__name__}")
        if isinstance(layer, ParallelLMHead) and _fp32_lm_head():
            raise W12Error(f"{prefix}: --enable-fp32-lm-head feeds the LM head float32 "
                           "activations, and the W12 GEMM takes BF16 ones; serve without that "
                           "option, or convert the checkpoint without --lm-head (a BF16 head)")
        return W12LinearMethod(prefix, modules)


_HEAD_CLASSES: dict[type, type] = {}


def _decoding_head_class(base: type) -> type:
    """``base`` (SGLang's LM head class) with a ``weight`` read from the W12 weight: the rank's
    BF16 rows, decoded at the first read and kept (its memory is spent only where something
    asks for it, such as EAGLE's shared head)."""
    if base not in _HEAD_CLASSES:
        def weight(self) -> torch.Tensor:
            decoded = self.__dict__.get("_w12_decoded")
            if decoded is None:
                decoded = self.__dict__["_w12_decoded"] = decode_weight(self.w12_weight)
            return decoded

        _HEAD_CLASSES[base] = type(f"W12{base.__name__}", (base,), {"weight": property(weight)})
    return _HEAD_CLASSES[base]


def _dummy_load() -> bool:
    """Whether the server loads random weights (SGLang's ``--load-format dummy``)."""
    try:
        from sglang.srt.runtime_context import get_model

        fmt = get_model().load_format
        return str(getattr(fmt, "value", fmt)).lower() == "dummy"
    except Exception:  # noqa: BLE001 -- no server configuration: a real load
        return False


def _fp32_lm_head() -> bool:
    """Whether SGLang runs the LM head on float32 activations (its ``--enable-fp32-lm-head``);
    False where no server configuration is published (layers built outside a server)."""
    try:
        from sglang.srt.runtime_context import get_exec

        return bool(get_exec().features.enable_fp32_lm_head)
    except Exception:  # noqa: BLE001 -- no published configuration: SGLang's default (off)
        return False


def _ancestors(modules) -> set[str]:
    """Every module name and every dotted prefix of it."""
    names = set()
    for module in modules:
        parts = module.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


class W12LinearMethod(LinearMethodBase):
    """Loads one layer's W12 planes (this rank's block) and runs ``w12_linear`` on them."""

    def __init__(self, prefix: str, checkpoint_modules: list[str]) -> None:
        self.prefix = prefix
        self.checkpoint_modules = checkpoint_modules
        self._rows: dict[object, shard.Rows] = {}
        self._cols: shard.Columns | None = None
        self._shape = (0, 0)
        self._pending: dict[object, dict[str, torch.Tensor]] = {}
        self._pieces: dict[object, shard.EscapePiece] = {}
        self._loaded: set[tuple[object, str]] = set()
        self._device = torch.device("cpu")  # where the packed weight goes (create_weights)

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        if getattr(layer, "use_presharded_weights", False):
            raise W12Error(f"{self.prefix}: W12 checkpoints are split across ranks at load "
                           f"time; pre-sharded checkpoints are not supported")
        self._rows, self._cols = _layer_plan(layer, input_size_per_partition, input_size)
        n, k = sum(output_partition_sizes), input_size_per_partition
        self._shape = (n, k)
        # SGLang builds the model under its target device; the checkpoint planes wait on the
        # host instead, so that the GPU never holds every layer's planes and its packed weight
        # at once: each layer's planes go to the device only to be packed
        self._device = _device_of(torch.empty(0).device)
        host = {"device": "cpu"}
        planes = {
            "hi": (torch.zeros(n, k, dtype=torch.uint8, **host),
                   {"output_dim": 0, "input_dim": 1}),
            "lo": (torch.zeros(n, spec.lo_width(k), dtype=torch.uint8, **host),
                   {"output_dim": 0, "input_dim": 1}),
            # rows no shard writes (padding) need a valid base exponent
            "e0": (torch.full((n,), spec.E0_MIN, dtype=torch.uint8, **host), {"output_dim": 0}),
            "esc_rowptr": (torch.zeros(n + 1, dtype=torch.int64, **host), {"output_dim": 0}),
            "esc_col": (torch.zeros(0, dtype=torch.int32, **host), {}),
            "esc_val": (torch.zeros(0, dtype=torch.int16, **host), {}),
        }
        for part, (data, dims) in planes.items():
            param = torch.nn.Parameter(data, requires_grad=False)
            set_weight_attrs(param, {**dims, "w12_part": part,
                                     "weight_loader": self.weight_loader})
            layer.register_parameter(f"w12_{part}", param)

    def weight_loader(self, param: torch.nn.Parameter, loaded_weight: torch.Tensor,
                      shard_id: object = None) -> None:
        """Cut this rank's block of one checkpoint tensor (full, unsplit) into place."""
        rows = self._rows.get(shard_id)
        if rows is None:
            raise W12Error(f"{self.prefix}: no W12 shard {shard_id!r} in this layer (expected "
                           f"one of {list(self._rows)}; fused checkpoint tensors are not "
                           f"supported)")
        part = param.w12_part
        expected = shard.expected_shape(part, rows, self._cols)
        if not shard.shape_matches(tuple(loaded_weight.shape), expected):
            raise W12Error(f"{self._tensor_name(shard_id, part)}: checkpoint shape "
                           f"{tuple(loaded_weight.shape)}, expected {expected} (-1: any)")
        if part in shard.DENSE:
            block = shard.slice_dense(part, loaded_weight, rows, self._cols)
            param.data.narrow(0, rows.local_start, rows.count).copy_(block)
        else:
            self._collect_escapes(shard_id, part, loaded_weight)
        self._loaded.add((shard_id, part))

    def _collect_escapes(self, shard_id: object, part: str, tensor: torch.Tensor) -> None:
        parts = self._pending.setdefault(shard_id, {})
        parts[part] = tensor
        if len(parts) == len(shard.ESCAPES):
            escapes = [parts[name] for name in shard.ESCAPES]
            self._pieces[shard_id] = shard.slice_escapes(*escapes, self._rows[shard_id],
                                                         self._cols)
            del self._pending[shard_id]

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        n, k = self._shape
        device = self._device
        if not self._loaded and _dummy_load():
            self._fill_dummy(layer)  # --load-format dummy: random planes, no checkpoint
        else:
            self._check_complete()
            covered = sum(rows.count for rows in self._rows.values())
            pieces = [*self._pieces.values(), shard.zero_rows(covered, n - covered, k)]
            for part, data in zip(shard.ESCAPES, shard.assemble(pieces), strict=True):
                getattr(layer, f"w12_{part}").data = data.to(device)
        planes = W12Tensor(*(getattr(layer, f"w12_{part}").data for part in shard.COMPONENTS))
        try:
            layer.w12_weight = prepare_weight(planes, device=device)
        except W12Error as error:
            raise W12Error(f"{self.prefix}: {error}") from None
        # the kernel layout replaces the checkpoint layout; keeping both would cost 12 more
        # bits per weight
        for part, dtype in PLANE_DTYPES.items():
            getattr(layer, f"w12_{part}").data = torch.empty(0, dtype=dtype, device=device)
        self._pieces.clear()
        if isinstance(layer, ParallelLMHead):
            layer.__class__ = _decoding_head_class(type(layer))

    def _fill_dummy(self, layer: torch.nn.Module) -> None:
        """Random planes for SGLang's dummy load (speed runs without a checkpoint): random
        records in a window of 2^-24 .. 2^-8 (SGLang's dummy floats are within 1e-3), no
        escapes, drawn per layer from its name so every rank of a layer agrees."""
        n, k = self._shape
        gen = torch.Generator().manual_seed(zlib.crc32(self.prefix.encode()))
        device = self._device
        planes = {"hi": torch.randint(0, 256, (n, k), generator=gen, dtype=torch.uint8),
                  "lo": torch.randint(0, 256, (n, spec.lo_width(k)), generator=gen,
                                      dtype=torch.uint8),
                  "e0": torch.full((n,), 127 - 24, dtype=torch.uint8),
                  "esc_rowptr": torch.zeros(n + 1, dtype=torch.int64),
                  "esc_col": torch.zeros(0, dtype=torch.int32),
                  "esc_val": torch.zeros(0, dtype=torch.int16)}
        for part, data in planes.items():
            getattr(layer, f"w12_{part}").data = data.to(device)

    def restore_weights_before_loading(self, layer: torch.nn.Module) -> None:
        raise W12Error(f"{self.prefix}: W12 weights cannot be reloaded in place (their "
                       f"checkpoint layout is freed after repacking); restart the server")

    def _check_complete(self) -> None:
        for shard_id in self._rows:
            for part in shard.COMPONENTS:
                if (shard_id, part) not in self._loaded:
                    raise W12Error(f"{self._tensor_name(shard_id, part)} was not loaded "
                                   f"(is the checkpoint complete?)")

    def _tensor_name(self, shard_id: object, part: str) -> str:
        index = list(self._rows).index(shard_id)
        return f"{self.checkpoint_modules[index]}.w12_{part}"

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        # Nothing under SGLang needs a row's bits to match another batch size's (its BF16
        # GEMMs do not either), so 65..128 rows take the large-M path: 0.75-0.78x of cuBLAS on
        # the H200 against 0.44-0.56x for the batch-invariant passes (run 265, docs/PERF.md)
        return w12_linear(x, layer.w12_weight, bias, invariant_rows=SMALL_M_MAX)


def _device_of(device: torch.device) -> torch.device:
    """``device`` with its index (the current CUDA device for a bare ``cuda``)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _layer_plan(layer: torch.nn.Module, k_local: int,
                k_total: int) -> tuple[dict[object, shard.Rows], shard.Columns]:
    """Which checkpoint rows and columns this rank holds, keyed by the loader's shard id."""
    if isinstance(layer, RowParallelLinear):
        cols = shard.Columns(layer.tp_rank * k_local, k_local, k_total)
        return _all_rows(layer.output_size), cols
    cols = shard.Columns(0, k_local, k_total)
    if isinstance(layer, QKVParallelLinear):
        return _qkv_rows(layer), cols
    if isinstance(layer, MergedColumnParallelLinear):
        return _merged_rows(layer), cols
    if isinstance(layer, ColumnParallelLinear):
        count = layer.output_size_per_partition
        return {None: shard.Rows(0, layer.tp_rank * count, count, layer.output_size)}, cols
    if isinstance(layer, ParallelLMHead):
        return _lm_head_rows(layer), cols
    return _all_rows(layer.output_size), cols  # ReplicatedLinear


def _all_rows(n: int) -> dict[object, shard.Rows]:
    return {None: shard.Rows(0, 0, n, n)}


def _qkv_rows(layer: QKVParallelLinear) -> dict[object, shard.Rows]:
    # mirrors QKVParallelLinear.weight_loader: K/V heads may be replicated across ranks
    q = layer.num_heads * layer.head_size
    k = layer.num_kv_heads * layer.head_size
    v = layer.num_kv_heads * layer.v_head_size
    kv_index = layer.kv_tp_rank // layer.num_kv_head_replicas
    return {
        "q": shard.Rows(0, layer.tp_rank * q, q, layer.total_num_heads * layer.head_size),
        "k": shard.Rows(q, kv_index * k, k, layer.total_num_kv_heads * layer.head_size),
        "v": shard.Rows(q + k, kv_index * v, v, layer.total_num_kv_heads * layer.v_head_size),
    }


def _merged_rows(layer: MergedColumnParallelLinear) -> dict[object, shard.Rows]:
    plan, start = {}, 0
    for index, total in enumerate(layer.output_sizes):
        count = total // layer.tp_size
        plan[index] = shard.Rows(start, layer.tp_rank * count, count, total)
        start += count
    return plan


def _lm_head_rows(layer: ParallelLMHead) -> dict[object, shard.Rows]:
    indices = layer.shard_indices
    count = indices.org_vocab_end_index - indices.org_vocab_start_index
    return {None: shard.Rows(0, indices.org_vocab_start_index, count, layer.org_vocab_size)}
