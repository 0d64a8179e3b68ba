"""Decode steps inside SGLang's own model class, W12 against BF16 in one run.

    python lab/sglang_decode.py --preset qwen3-8b --batch 1,8,32 --context 512 [--tp 2] [--json OUT]

SGLang's model class for the preset's architecture (``Qwen3ForCausalLM`` for the Qwen3
presets, ``LlamaForCausalLM`` for Llama-shaped ones) is built twice by SGLang's real loader
with ``--load-format dummy``, at TP 1 or, with ``--tp N``, in N processes of one rank each
(one GPU each, NCCL; gloo on a CPU): once plain (random BF16 weights) and once on a config
whose ``quantization_config`` names every linear and the LM head as W12, so that the plugin
gives those layers random W12 planes. A decode step is one forward of B tokens in DECODE mode
through the whole model (embedding, decoder layers, RoPE, norms, LM head and
``LogitsProcessor``). On a GPU each (mode, batch) step is captured in a CUDA graph and the two
modes' graphs are replayed in turn (``benchmarks/harness.time_graphs``); the ratio is BF16 time
over W12 time (rank 0's, under TP: every rank replays the same steps, whose all-reduces keep
them in step). SGLang's custom all-reduce is a compiled kernel: it is turned off, so TP steps
all-reduce through NCCL. On a CPU (``--device cpu``: a smoke run of a tiny preset) the steps
run eagerly and only their finiteness is checked.

What stands in for SGLang's compiled parts, the same in both modes, and nothing else:

- attention is ``CachedSDPA``: per layer a cache of ``context`` random keys and values a
  request; each step writes its key and value at slot ``context`` and attends over the
  ``context + 1`` slots with torch SDPA (SGLang's GPU backends are compiled packages);
- SGLang's fused ops (norms, activations, RoPE: ``BaseFusedOp``) run their native torch
  forward, as they do on a CPU (their CUDA forwards call compiled kernel packages);
- ``vllm._custom_ops`` is an import-only module whose ``rotary_embedding`` raises;
  ``torchvision`` is a placeholder where none is installed;
- SGLang's compiled CUDA packages (``COMPILED``: ``sgl_kernel``, ``flashinfer``, ...), which
  its modules import on a CUDA machine, are import-only placeholders where they are missing:
  every name imports, and a run that calls one stops with its name.

Needs SGLang 0.5.21's Python modules (``pip install --no-deps sglang==0.5.21`` and
``tests/sglang_integration/requirements.txt``) and this repository on the path.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import sys
import tempfile
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "benchmarks"),
                str(HERE.parent / "tests" / "sglang_integration")]

MODEL_TYPES = {"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def hf_config(preset: str) -> dict:
    """The preset's Hugging Face config (``engine.presets``), with its model type named."""
    from engine.presets import preset_config

    config = dict(preset_config(preset))
    arch = config.get("architectures", ["?"])[0]
    if arch not in MODEL_TYPES:
        raise SystemExit(f"{preset}: {arch}; this script runs {', '.join(MODEL_TYPES)}")
    config.update(model_type=MODEL_TYPES[arch], torch_dtype="bfloat16", hidden_act="silu")
    return config


def write_folders(root: Path, config: dict) -> tuple[Path, Path]:
    """A BF16 folder (config only) and a W12 one whose quantization_config converts every
    linear of every layer and the LM head (dummy loads read no weights)."""
    from w12 import container

    layers = int(config["num_hidden_layers"])
    modules = [f"model.layers.{i}.{name}" for i in range(layers) for name in LINEARS]
    w12_config = dict(config, quantization_config=container.quantization_config(
        converted_modules=[*modules, "lm_head"], lm_head_converted=True,
        embeddings_converted=False, lossless_relative_to="source"))
    folders = []
    for name, cfg in (("bf16", config), ("w12", w12_config)):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        folders.append(folder)
    return folders[0], folders[1]


# SGLang's compiled CUDA packages (CUDA builds with their own dependencies: not installed)
COMPILED = ("sgl_kernel", "flashinfer", "deep_gemm", "tvm_ffi", "cuda_tile", "quack",
            "tilelang", "humming", "tokenspeed_mla", "sgl_deep_ep", "deep_ep")


class _PlaceholderType(type):
    """A name from a compiled package, as a class (modules subclass some): its attributes are
    placeholders too; calling it raises, so a run that reached a compiled kernel stops and
    names it."""

    def __getattr__(cls, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _placeholder(f"{cls._name}.{attr}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"{cls._name}: SGLang's compiled package is not installed here")


def _placeholder(name: str) -> type:
    return _PlaceholderType(name.rsplit(".", 1)[-1], (), {"_name": name})


class _Missing(types.ModuleType):
    """An import-only stand-in of a compiled package (``from pkg.sub import name`` succeeds)."""

    __path__: list[str] = []  # a package: its submodules import too

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _placeholder(f"{self.__name__}.{attr}")


class _CompiledStandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in COMPILED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Missing(spec.name)

    def exec_module(self, module):
        pass


def install_stand_ins() -> None:
    """The CPU model-class test's stand-ins (torchvision, ``vllm._custom_ops``), import-only
    stand-ins of SGLang's compiled CUDA packages (``COMPILED``) where they are missing, and
    SGLang's fused ops on their native forward."""
    from model_class_runner import install_stand_ins as runner_stand_ins

    runner_stand_ins()
    if not any(isinstance(f, _CompiledStandIns) for f in sys.meta_path):
        sys.meta_path.append(_CompiledStandIns())  # after the real finders: installed wins
    from sglang.kernels.fused_op import BaseFusedOp

    BaseFusedOp._resolve_forward_method = lambda self: self.forward_native


class CachedSDPA:
    """Decode attention over a fixed cache (module docstring): ``batch`` requests, ``context``
    cached positions each, one new token a step written at slot ``context``."""

    def __init__(self, batch: int, context: int, device: torch.device, seed: int = 0) -> None:
        self.batch, self.context, self.device = batch, context, device
        self.caches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def _cache(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        if layer.layer_id not in self.caches:
            shape = (self.batch, layer.tp_k_head_num, self.context + 1, layer.qk_head_dim)
            k = torch.randn(shape, generator=self.gen, device=self.device).to(torch.bfloat16)
            v = torch.randn(shape, generator=self.gen, device=self.device).to(torch.bfloat16)
            self.caches[layer.layer_id] = (k, v)
        return self.caches[layer.layer_id]

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        import torch.nn.functional as F

        b = q.shape[0]
        k_cache, v_cache = self._cache(layer)
        k_cache[:, :, self.context] = k.view(b, layer.tp_k_head_num, layer.qk_head_dim)
        v_cache[:, :, self.context] = v.view(b, layer.tp_v_head_num, layer.v_head_dim)
        q = q.view(b, layer.tp_q_head_num, 1, layer.qk_head_dim)
        out = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True,
                                             scale=layer.scaling)
        return out.reshape(b, -1)


def build(folder: Path, device: str):
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import get_model_loader

    config = ModelConfig(model_path=str(folder), dtype="bfloat16")
    loader = get_model_loader(LoadConfig(load_format="dummy"))
    return loader.load_model(model_config=config, device_config=DeviceConfig(device))


def spawn_ranks(tp: int) -> int:
    """This script once per rank (``--rank``), all on one free port; rank 0's output is shown,
    another rank's only when it fails. Returns the worst exit status."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, __file__, *sys.argv[1:], "--port", str(port)]
    procs = [subprocess.Popen([*command, "--rank", str(r)],
                              stdout=None if r == 0 else subprocess.PIPE,
                              stderr=None if r == 0 else subprocess.STDOUT, text=True)
             for r in range(tp)]
    status = 0
    for r, proc in enumerate(procs):
        out, _ = proc.communicate()
        if proc.returncode:
            status = max(status, proc.returncode)
            if out:
                print(f"--- rank {r} exited {proc.returncode}:\n{out[-3000:]}", file=sys.stderr)
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3-8b")
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--calls", type=int, default=10, help="steps per captured graph")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor-parallel ranks: one process (and GPU) each")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29517, help=argparse.SUPPRESS)
    parser.add_argument("--json")
    a = parser.parse_args()
    if a.tp < 1:
        raise SystemExit(f"--tp {a.tp}: needs at least one rank")
    if a.tp > 1 and a.rank is None:
        raise SystemExit(spawn_ranks(a.tp))
    rank = a.rank or 0
    torch.manual_seed(0)  # every rank draws the same token ids
    install_stand_ins()
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from sglang_integration.plugin import register

    register()
    device = torch.device(a.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    config = hf_config(a.preset)
    root = Path(tempfile.mkdtemp(prefix="w12-sglang-decode-"))
    bf16_dir, w12_dir = write_folders(root, config)
    args = ServerArgs(model_path=str(bf16_dir), device=device.type, tp_size=a.tp,
                      load_format="dummy", disable_custom_all_reduce=True)
    set_global_server_args_for_scheduler(args)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=rank))
    from sglang.srt.distributed import parallel_state

    parallel_state.set_custom_all_reduce(False)
    backend = "nccl" if device.type == "cuda" else "gloo"
    init_distributed_environment(backend=backend, world_size=a.tp, rank=rank, local_rank=rank,
                                 distributed_init_method=f"tcp://127.0.0.1:{a.port}")
    initialize_model_parallel(backend=backend)  # the widths publish() set (tp_size)
    models = {"bf16": build(bf16_dir, device.type), "w12": build(w12_dir, device.type)}
    methods = {name: type(m.model.layers[0].mlp.down_proj.quant_method).__name__
               for name, m in models.items()}
    if methods != {"bf16": "UnquantizedLinearMethod", "w12": "W12LinearMethod"}:
        raise SystemExit(f"unexpected linear methods: {methods}")
    rows = []
    env = {"device": str(device), "preset": a.preset, "context": a.context, "tp": a.tp}
    say = print if rank == 0 else (lambda *args, **kwargs: None)
    if device.type == "cuda":
        from harness import environment

        env.update(environment())
    say(f"# {env.get('gpu', a.device)}  {a.preset} (SGLang's {config['architectures'][0]}), "
        f"context {a.context}, TP {a.tp}, dummy weights")
    for b in map(int, a.batch.split(",")):
        attention = CachedSDPA(b, a.context, device)
        set_forward_context(ForwardContext(attn_backend=attention))
        ids = torch.randint(0, int(config["vocab_size"]), (b,), device=device)
        positions = torch.full((b,), a.context, dtype=torch.long, device=device)
        meta = LogitsMetadata(forward_mode=ForwardMode.DECODE)
        meta.mha_return_lse, meta.attn_cp_metadata = False, None

        def step(model, ids=ids, positions=positions, meta=meta):
            return model(ids, positions, meta).next_token_logits

        with torch.inference_mode():
            outs = {name: step(m) for name, m in models.items()}
            for name, out in outs.items():
                if out.shape != (b, int(config["vocab_size"])) or not torch.isfinite(out).all():
                    raise SystemExit(f"{name} at batch {b}: logits {tuple(out.shape)}, "
                                     f"finite {bool(torch.isfinite(out).all())}")
            if device.type != "cuda":
                say(f"batch {b:>3}: both steps ran, logits finite {tuple(outs['w12'].shape)}")
                continue
            from harness import time_graphs

            bf16_us, w12_us = time_graphs([[lambda m=models["bf16"]: step(m)] * a.calls,
                                           [lambda m=models["w12"]: step(m)] * a.calls])
        row = {"batch": b, "bf16_ms": bf16_us / 1e3, "w12_ms": w12_us / 1e3,
               "speedup": bf16_us / w12_us}
        rows.append(row)
        say(f"batch {b:>3}: BF16 {row['bf16_ms']:7.3f} ms  W12 {row['w12_ms']:7.3f} ms  "
            f"W12 / BF16 speed x{row['speedup']:.3f}", flush=True)
    if a.json and rank == 0:
        Path(a.json).write_text(json.dumps({"environment": env, "methods": methods,
                                            "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
