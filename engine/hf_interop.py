"""W12 weights inside a ``transformers`` model, so ``model.generate`` runs on the format too.

``swap_in_w12_linears`` replaces every ``nn.Linear`` whose weight a W12 folder stores as W12
by an engine ``Linear`` running ``w12_linear`` (same names, same bias, on the model's device);
everything else in the model is left alone. ``load_w12_for_transformers`` builds the model
from a W12 folder alone: the architecture from its ``config.json`` (without the
``quantization_config``, which ``transformers`` does not know), the plain tensors loaded as
stored, the W12 ones swapped in. ``transformers`` is imported only here.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engine.model import Linear
from engine.w12_backend import prepare
from engine.weights import is_w12_config, read_config
from w12.errors import W12Error
from w12.tensor import W12Tensor


def _reader(folder: Path):
    from w12.container import FolderReader

    if not is_w12_config(read_config(folder)):
        raise W12Error(f"{folder}/config.json: not a W12 folder (no w12 quantization_config)")
    return FolderReader(Path(folder))


def swap_in_w12_linears(model: nn.Module, folder: Path) -> list[str]:
    """Swap the model's linears for the W12 ones stored in ``folder``; return the swapped names."""
    reader = _reader(folder)
    stored = set(reader.names())
    swapped = []
    for name, module in list(model.named_modules()):
        weight_name = f"{name}.weight"
        if not isinstance(module, nn.Linear) or weight_name not in stored:
            continue
        if not reader.is_w12(weight_name):
            continue
        w = reader.read(weight_name)
        if tuple(w.shape) != tuple(module.weight.shape):
            raise W12Error(f"{folder}: tensor {weight_name} has shape {tuple(w.shape)}, the "
                           f"model's {name} expects {tuple(module.weight.shape)}")
        _replace(model, name, _w12_linear(module, w))
        swapped.append(name)
    return swapped


def _w12_linear(module: nn.Linear, w: W12Tensor) -> Linear:
    replacement = Linear(module.in_features, module.out_features)
    replacement.packed = prepare(w.to(module.weight.device))
    if module.bias is not None:
        replacement.bias = module.bias.detach()
    return replacement


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def load_w12_for_transformers(folder: Path, *, device="cpu", dtype=torch.bfloat16):
    """A ``transformers`` causal LM built from a W12 folder, its W12 linears running W12."""
    try:
        import transformers
    except ImportError as exc:
        raise W12Error("this needs the 'transformers' package (pip install transformers)") from exc
    folder = Path(folder)
    config_dict = dict(read_config(folder))
    config_dict.pop("quantization_config", None)
    model_type = config_dict.pop("model_type", None)
    if model_type is None:
        raise W12Error(f"{folder}/config.json: no model_type")
    config = transformers.AutoConfig.for_model(model_type, **config_dict)
    # built in the dtype (not cast afterwards, which would round RoPE's fp32 buffers); the
    # argument was renamed from torch_dtype to dtype in transformers 4.56
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_config(config, **{dtype_arg: dtype})
    model = model.to(device).eval()
    _load_plain_tensors(model, _reader(folder), folder)  # biases first: the swap keeps them
    swap_in_w12_linears(model, folder)
    return model


def _load_plain_tensors(model: nn.Module, reader, folder: Path) -> None:
    params = dict(model.named_parameters())
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for name in reader.names():
        if reader.is_w12(name) and name.rpartition(".")[0] in linears:
            continue  # swapped in as W12 afterwards
        if name not in params:
            raise W12Error(f"{folder}: tensor {name} has no place in the transformers model")
        value = reader.read(name)
        value = value.decode() if isinstance(value, W12Tensor) else value
        target = params[name]
        if tuple(value.shape) != tuple(target.shape):
            raise W12Error(f"{folder}: tensor {name} has shape {tuple(value.shape)}, the model "
                           f"expects {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(value.to(target.dtype))
