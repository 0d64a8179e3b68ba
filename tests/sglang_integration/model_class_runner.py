"""SGLang's own model classes on W12 weights, one tensor-parallel rank per process (CPU).

    python model_class_runner.py KIND BF16_DIR W12_DIR TP RANK PORT [SERVER_ARGS_JSON]

Builds SGLang's ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` twice through its real loader
(``DefaultModelLoader``, or the one ``SERVER_ARGS_JSON``'s ``load_format`` names; the BF16
folder without quantization, the W12 folder through the plugin), initialises the process
group the way SGLang does (its own ``init_distributed_environment`` /
``initialize_model_parallel``, gloo), runs one prefill of a fixed prompt through the full
model (its embedding, decoder layers, RoPE, norms, LM head and ``LogitsProcessor``, with the
tensor-parallel all-reduces and all-gathers) and prints one JSON line: whether the two logits
are bit-identical, their shape, a digest of the W12 logits, and whether
``get_embed_and_head`` gives the same LM head rows (EAGLE's shared head).

What stands in for GPU-only parts, and nothing else: attention is causal SDPA over the prompt
(``CausalSDPA``: SGLang's backends need CUDA kernels or its CPU kernel package), and
``vllm._custom_ops`` is a module whose ``rotary_embedding`` raises (SGLang imports it where it
finds no GPU; the native RoPE path runs instead, and a call would fail the test).
"""

from __future__ import annotations

import hashlib
import json
import sys
import types

PROMPT = [5, 17, 33, 2, 249, 8, 9, 100, 42, 7, 7, 13]


def install_stand_ins() -> None:
    sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/cpu_site")
    import sglang_cpu_stubs

    sglang_cpu_stubs.install()
    vllm, ops = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")

    def rotary_embedding(*args, **kwargs):
        raise RuntimeError("vllm._custom_ops.rotary_embedding stand-in was called")

    ops.rotary_embedding = rotary_embedding
    vllm._custom_ops = ops
    sys.modules.setdefault("vllm", vllm)
    sys.modules.setdefault("vllm._custom_ops", ops)


class CausalSDPA:
    """The attention backend of one request's prefill: causal attention over its own tokens."""

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        import torch.nn.functional as F

        t = q.shape[0]
        q = q.view(t, layer.tp_q_head_num, layer.qk_head_dim).transpose(0, 1)
        k = k.view(t, layer.tp_k_head_num, layer.qk_head_dim).transpose(0, 1)
        v = v.view(t, layer.tp_v_head_num, layer.v_head_dim).transpose(0, 1)
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                             enable_gqa=True, scale=layer.scaling)
        return out[0].transpose(0, 1).reshape(t, -1)


def main(kind: str, bf16_dir: str, w12_dir: str, tp: int, rank: int, port: int,
         extra: dict) -> None:
    install_stand_ins()
    import torch
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context
    from sglang.srt.model_loader.loader import get_model_loader
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from sglang_integration.plugin import register

    register()
    args = ServerArgs(model_path=bf16_dir, device="cpu", tp_size=tp, **extra)
    set_global_server_args_for_scheduler(args)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=rank))  # as a scheduler does
    init_distributed_environment(backend="gloo", world_size=tp, rank=rank, local_rank=rank,
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel(backend="gloo")
    set_forward_context(ForwardContext(attn_backend=CausalSDPA()))
    ids = torch.tensor(PROMPT)
    batch = LogitsMetadata(forward_mode=ForwardMode.EXTEND,
                           extend_seq_lens=torch.tensor([len(PROMPT)]),
                           extend_seq_lens_cpu=[len(PROMPT)])
    # the ForwardBatch fields the model reads beyond the logits metadata, for one prefill
    batch.mha_return_lse, batch.attn_cp_metadata = False, None
    logits, methods, heads = {}, {}, {}
    with torch.inference_mode():
        for name, folder in (("bf16", bf16_dir), ("w12", w12_dir)):
            config = ModelConfig(model_path=folder, dtype="bfloat16")
            loader = get_model_loader(LoadConfig(load_format=args.load_format))
            model = loader.load_model(model_config=config, device_config=DeviceConfig("cpu"))
            if type(model).__name__.lower() != f"{kind}forcausallm":
                raise SystemExit(f"{folder}: SGLang built {type(model).__name__}")
            methods[name] = type(model.model.layers[0].mlp.down_proj.quant_method).__name__
            out = model(ids, torch.arange(len(PROMPT)), batch)
            logits[name] = out.next_token_logits.clone()
            heads[name] = model.get_embed_and_head()[1]  # what EAGLE shares with its draft
            again = model(ids, torch.arange(len(PROMPT)), batch).next_token_logits
            if not torch.equal(again, logits[name]):
                raise SystemExit(f"{name}: reading the head changed the logits")
    w12 = logits["w12"]
    print(json.dumps({
        "equal": bool(torch.equal(logits["bf16"], w12)), "shape": list(w12.shape),
        "head_equal": bool(torch.equal(heads["bf16"].view(torch.int16),
                                       heads["w12"].view(torch.int16))),
        "finite": bool(torch.isfinite(w12).all()), "methods": methods,
        "loader": type(loader).__name__,
        "digest": hashlib.sha256(w12.float().numpy().tobytes()).hexdigest()[:16]}))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), json.loads(a[6]) if a[6:] else {})
